"""lucid: DreamerV3 world-model agents in PyTorch."""

__version__ = "0.1.0"


def __getattr__(name):  # lazy, so `import lucid.nets` stays light
    if name == "Dreamer":
        from .api import Dreamer
        return Dreamer
    if name == "train_seeds":
        from .api import train_seeds
        return train_seeds
    if name == "LucidWarning":
        from .warn import LucidWarning
        return LucidWarning
    raise AttributeError(name)


__all__ = ["Dreamer", "LucidWarning", "train_seeds", "__version__"]
