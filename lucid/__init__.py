"""lucid: DreamerV3 world-model agents in PyTorch."""

__version__ = "0.1.0"


def __getattr__(name):  # lazy, so `import lucid.nets` stays light
    if name == "Dreamer":
        from .api import Dreamer
        return Dreamer
    if name == "LucidWarning":
        from .warn import LucidWarning
        return LucidWarning
    raise AttributeError(name)


__all__ = ["Dreamer", "LucidWarning", "__version__"]
