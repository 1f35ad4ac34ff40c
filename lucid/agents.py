"""Which agent a config builds: the Nature recipe's (`model.recipe=nature`), or the 2023
paper's `Agent` and the subclasses `model.agent` names."""

from __future__ import annotations

from .agent import agent_class as agent_2023
from .config import Config, ConfigError
from .nature_agent import NatureAgent


def agent_class(config: Config) -> type:
    """The class whose `(obs_spec, act_spec, config, device)` makes the run's agent."""
    if config.model.recipe == "nature":
        if config.model.agent:
            raise ConfigError(f"model.agent={config.model.agent!r} subclasses the 2023 "
                              f"recipe's Agent; model.recipe=nature builds its own networks "
                              f"(leave model.agent empty)")
        return NatureAgent
    return agent_2023(config)
