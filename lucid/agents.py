"""Which agent a config builds: the Nature recipe's (`model.recipe=nature`), the exploring
agent (`explore.method=p2e`), or the 2023 paper's `Agent` and the subclasses `model.agent`
names."""

from __future__ import annotations

from .agent import agent_class as agent_2023
from .config import Config, ConfigError
from .explore_agent import ExploreAgent
from .nature_agent import NatureAgent


def _built_in(config: Config) -> tuple[type | None, str]:
    """The agent a setting builds in place of the 2023 `Agent`, and why `model.agent` can't
    change it."""
    if config.model.recipe == "nature":
        return NatureAgent, "model.recipe=nature builds its own networks"
    if config.explore.method == "p2e":
        return ExploreAgent, "explore.method=p2e builds on lucid's own Agent for now"
    return None, ""


def replay_fields(config: Config) -> dict:
    """What the config's agent stores in the replay beside the env's steps (the Nature
    recipe's latents, `train.replay_context`): name -> (shape, dtype) of one step."""
    return NatureAgent.context_fields(config) if config.model.recipe == "nature" else {}


def agent_class(config: Config) -> type:
    """The class whose `(obs_spec, act_spec, config, device)` makes the run's agent."""
    cls, why = _built_in(config)
    if cls is None:
        return agent_2023(config)
    if config.model.agent:
        raise ConfigError(f"model.agent={config.model.agent!r} subclasses the 2023 recipe's "
                          f"Agent, but {why} (leave model.agent empty)")
    return cls
