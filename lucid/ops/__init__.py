"""Speed paths: the same functions as a plain computation in lucid.nets, computed faster.
Each module names its plain twin, and tests/test_fast_paths.py compares the two. Tensors only:
nothing here imports the rest of lucid."""
