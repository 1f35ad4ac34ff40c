"""Generate docs/configuration.md from the typed config in lucid/config.py.

    python -m lucid.config_doc            # rewrite docs/configuration.md
    python -m lucid.config_doc --check    # exit 1 if the checked-in file is out of date
    python -m lucid.config_doc --stdout   # print it

Every key comes from the dataclasses (name, type, default); the text from the comments next to
the fields in lucid/config.py: a comment at the end of a field's line describes that field, and
a block of comment lines above a field introduces it and the fields after it. The model sizes
and presets come from `SIZES` and `PRESETS`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
from pathlib import Path

from . import config as C

SECTIONS = [("env", C.EnvConfig), ("model", C.ModelConfig), ("train", C.TrainConfig),
            ("run", C.RunConfig), ("explore", C.ExploreConfig)]
DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

# Descriptions of the fields that have no comment of their own in lucid/config.py. A comment
# there takes precedence; tests/test_docs.py checks that every field has one or the other and
# that no entry here names a field that does not exist.
DESCRIPTIONS: dict[str, str] = {
    "env.id": "gymnasium id, suite name (`atari:Pong`, `dmc:walker-walk`, ...; "
              "docs/environments.md), `module.path:EnvClass` / `module.path:make_fn`, or "
              "`path/to/file.py:EnvClass` (saved with the file's absolute path)",
    "env.num_envs": "environments stepped in parallel (one gymnasium vector env)",
    "env.kwargs": "keyword arguments given to the env (see above), e.g. `env.kwargs.gray=true`",
    "model.size": "row of the size table below",
    "model.gru_units": "units of the GRU state h",
    "model.dense_units": "units of the MLP layers",
    "model.dense_layers": "hidden layers per MLP",
    "train.actor_baseline_grad": "the dynamics gradient's baseline: (R_t - v_t) / S with v_t "
                                 "stop-gradient (false: the actor follows the returns alone, "
                                 "as the paper words it) or with its gradient (true: the "
                                 "authors' code and RLlib; v_t, t >= 1, depends on the "
                                 "earlier imagined actions)",
    "run.tag": "a name for the variant a run belongs to (`run.tag=my-actor`), for changes "
               "to the code that its config cannot show: lucid plot draws runs of different "
               "tags as different curves and labels them by it",
    "model.agent": "the Agent class, `module.path:Class` or `path/to/file.py:Class` of a "
                   "subclass of lucid.agent.Agent whose build_world_model / build_actor / "
                   "build_critic return other networks (empty: lucid's own; "
                   "docs/extending.md)",
    "model.vector_units": "units of the encoder's and decoder's MLP for vector observations "
                          "(null: model.dense_units); the authors' 2023 code runs 1024 at "
                          "every size, as preset dmc-proprio does (docs/algorithm.md)",
    "model.vector_layers": "hidden layers of that MLP (null: model.dense_layers; the "
                           "authors' code: 5)",
    "model.cnn_mult": "channel multiplier of the image encoder and decoder",
    "model.latent_groups": "categorical variables in the latent z",
    "model.latent_classes": "classes per categorical variable of z",
    "model.actor_unimix": "the discrete actor's share of the uniform distribution, where it "
                          "should differ from the latents' (null: model.unimix; the authors' "
                          "actor.unimix)",
    "model.unimix": "share of the uniform distribution mixed into every categorical "
                    "(latents, discrete actions)",
    "model.num_bins": "two-hot bins of the reward head and the critic",
    "model.bins_low": "lowest bin, in symlog space",
    "model.bins_high": "highest bin, in symlog space",
    "model.actor_min_std": "lower bound of the actor's std for continuous actions",
    "model.actor_max_std": "upper bound of the actor's std for continuous actions",
    "model.action_clip": "continuous actions entering the RSSM are scaled to at most this "
                         "magnitude per dimension, a · sg(c / max(c, |a|)) (the authors' "
                         "rssm.action_clip; the env gets actions clipped to its bounds "
                         "anyway); 0 = off",
    "train.batch_size": "B: replayed windows per update",
    "train.batch_length": "T: steps per replayed window",
    "train.horizon": "H: imagined steps from every posterior state",
    "train.gamma": "discount",
    "train.lam": "λ of the λ-returns",
    "train.decoder_scale": "weight of the decoder's loss in L_pred (the paper: 1 for each "
                           "prediction term; the authors' loss_scales.dec)",
    "train.reward_scale": "weight of the reward head's loss in L_pred",
    "train.cont_scale": "weight of the continue head's loss in L_pred",
    "train.dyn_scale": "weight of the dynamics KL (prior towards the stopped posterior)",
    "train.rep_scale": "weight of the representation KL (posterior towards the stopped prior)",
    "train.free_nats": "both KL terms are clipped below at this many nats (free bits)",
    "train.dyn_free_nats": "the dynamics KL's clip where it should differ from free_nats (the "
                           "authors' config has one per term: dyn.free, rep.free)",
    "train.rep_free_nats": "the representation KL's clip where it should differ from free_nats",
    "train.model_lr": "Adam learning rate of the world model",
    "train.model_eps": "Adam epsilon of the world model",
    "train.model_clip": "gradient-norm clip of the world model",
    "train.actor_lr": "Adam learning rate of the actor",
    "train.actor_eps": "Adam epsilon of the actor",
    "train.actor_clip": "gradient-norm clip of the actor",
    "train.critic_lr": "Adam learning rate of the critic",
    "train.critic_eps": "Adam epsilon of the critic",
    "train.critic_clip": "gradient-norm clip of the critic",
    "train.entropy": "actor entropy bonus η",
    "train.slow_critic_fraction": "EMA rate of the slow critic copy per update",
    "train.slow_critic_reg": "weight of the critic's regulariser towards the slow copy",
    "train.return_norm_decay": "EMA decay of the return percentiles",
    "train.prefill_random": "`true`: the train.prefill steps take uniformly random actions; "
                            "`false`: the policy acts from the first step, and the updates "
                            "still wait for train.prefill steps (the authors' current code, "
                            "which starts once its replay holds B·T steps)",
    "train.replay_context": "model.recipe=nature: `1` stores each step's latent state (h, z) "
                            "in the replay, as the policy saw it and then as each update "
                            "inferred it, and starts a training window from the stored state "
                            "of the step before it (the authors' replay_context); `0` starts "
                            "every window from the zero state",
    "train.continuous_grad": "how an actor over Box actions only learns: `dynamics` "
                             "(backprop through the world model, the 2023 paper) or "
                             "`reinforce` (the 2025 paper); spaces with discrete actions, "
                             "Dict/Tuple spaces of discrete and Box leaves too, always learn "
                             "by REINFORCE",
    "train.compile": "`true` to compile (see above); `null`: compiled on CUDA when the "
                     "update is graphed (one process) and torch.compile can build GPU "
                     "kernels there, else eager (the Nature recipe: eager, as its graph is "
                     "not the default yet)",
    "run.seed": "seed of python, numpy and torch (envs and replay derive theirs from it)",
    "run.device": "`auto` (CUDA when torch sees a GPU, else CPU), `cpu`, `cuda` or `cuda:N`",
    "run.run_dir": "where the run is written; `null` = `runs/<env>-<date>-<time>-s<seed>`",
    "run.eval_episodes": "episodes per evaluation (greedy, then sampled policy)",
    "run.checkpoint_minutes": "minutes between checkpoints",
    "run.keep_checkpoints": "newest checkpoints kept in RUN_DIR/checkpoints",
    "run.progress": "progress bar on a terminal; when stdout is not a terminal, one plain "
                    "line a minute",
    "run.runners": "`local` or `ray`",
    "run.num_runners": "Ray env runners (actors)",
    "run.envs_per_runner": "envs stepped by each Ray runner",
    "run.dist_check_every": "updates between parameter checksums (0 = never)",
    "run.logger": "a name, a comma string or a list: `tensorboard` (RUN_DIR/tb), `wandb` "
                  "(RUN_DIR/wandb, needs `pip install 'lucid-rl[wandb]'`), `none`",
    "run.wandb_mode": "`offline`, `online` or `disabled`",
}


def _value(v) -> str:
    """A default as it would be written on the command line (YAML)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v else '""'
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return repr(v)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _trailing_comment(line: str) -> str:
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return tok.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):  # a field spread over several lines
        pass
    return ""


def field_comments(cls) -> dict[str, tuple[str, str]]:
    """{field: (comment block above it, comment at the end of its line)} from the source."""
    lines, _ = inspect.getsourcelines(cls)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    out: dict[str, tuple[str, str]] = {}
    for node in tree.body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        i = node.lineno - 1
        above = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        out[node.target.id] = (" ".join(above), _trailing_comment(lines[i]))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def section_markdown(name: str, cls) -> str:
    comments = field_comments(cls)
    doc = inspect.getdoc(cls)
    parts = [f"## `{name}`\n"]
    if doc and not doc.startswith(cls.__name__ + "("):  # not the dataclass-generated signature
        parts.append(doc + "\n")
    table: list[str] = []

    def flush():
        if table:
            parts.append("| key | type | default | description |\n|---|---|---|---|\n"
                         + "".join(table))
            table.clear()

    for f in dataclasses.fields(cls):
        above, trailing = comments.get(f.name, ("", ""))
        if above:
            flush()
            parts.append(_cell(above) + "\n")
        text = trailing or DESCRIPTIONS.get(f"{name}.{f.name}", "")
        table.append(f"| `{name}.{f.name}` | `{f.type}` | `{_value(_default(f))}` | "
                     f"{_cell(text)} |\n")
    flush()
    return "\n".join(parts)


def _flatten(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={_value(v)}")
    return out


def sizes_markdown() -> str:
    head = ("| `model.size` | GRU units | dense units | dense layers | CNN multiplier | "
            "latent groups | latent classes |\n|---|---|---|---|---|---|---|\n")
    rows = "".join(f"| `{name}` | " + " | ".join(str(x) for x in dims) + " |\n"
                   for name, dims in C.SIZES.items())
    nature = ("\nWith `model.recipe=nature` (`--preset nature`) the sizes are the authors' "
              "current ones, named by their parameter count (32 latents and 8 GRU blocks at "
              "every size; heads of 1 layer for reward and continue, 3 for actor, critic, "
              "encoder and decoder MLPs):\n\n"
              "| `model.size` | deter | hidden | latent classes | CNN depth | units |\n"
              "|---|---|---|---|---|---|\n"
              + "".join(f"| `{name}` | " + " | ".join(str(x) for x in dims) + " |\n"
                        for name, dims in C.NATURE_SIZES.items()))
    return head + rows + nature


def presets_markdown() -> str:
    rows = []
    for name, over in C.PRESETS.items():
        keys = _flatten(over)
        rows.append(f"| `{name}` | " + (", ".join(f"`{k}`" for k in keys) or "(the defaults)")
                    + " |\n")
    return "| preset | overrides |\n|---|---|\n" + "".join(rows)


def render() -> str:
    top = [f for f in dataclasses.fields(C.Config) if f.name not in dict(SECTIONS)]
    parts = [
        "# Configuration reference\n",
        "<!-- Generated by `python -m lucid.config_doc` from lucid/config.py; do not edit by "
        "hand. tests/test_docs.py checks that it is up to date. -->\n",
        inspect.getdoc(C).strip() + "\n",
        "Every key below is given as `section.key=value` after `lucid train ENV` (e.g. "
        "`lucid train CartPole-v1 train.train_ratio=64 run.logger=tensorboard,wandb`), in "
        "Python as `Dreamer(env, train__train_ratio=64)` or "
        "`make_config(preset, [\"train.train_ratio=64\"])`. The value is parsed as YAML "
        "(`null`, `true`, numbers, `[a,b]` lists). Precedence: dataclass default < preset < "
        "command-line options (`--steps`, `--size`, ...) < overrides. An unknown key is refused "
        "with the closest valid key named, a value of the wrong type with its key and the "
        "type it needs; `lucid config [ENV] [--preset NAME] [--size S] [overrides]` prints "
        "the config `lucid train` would run with, and every run keeps its own in "
        "`RUN_DIR/config.yaml`.\n",
        "## Top level\n",
        "| key | type | default | description |\n|---|---|---|---|\n"
        + "".join(f"| `{f.name}` | `{f.type}` | `{_value(_default(f))}` | "
                  f"the preset the config was built from (`--preset`) |\n" for f in top),
    ]
    for name, cls in SECTIONS:
        parts.append(section_markdown(name, cls))
    parts += [
        "## Model sizes\n",
        "`model.size` picks a row; `model.gru_units` ... `model.latent_classes` override single "
        "entries. `XS` ... `XL` are the paper's sizes; `nano`, `micro`, `mini` and `XXS` are "
        "smaller ones for CPUs and tests.\n",
        sizes_markdown(),
        "## Presets\n",
        "`--preset NAME` (Python: `preset=`) applies these overrides on top of the defaults "
        "(docs/presets.md explains them). Without `--preset`, `lucid train` and "
        "`Dreamer(env)` pick the preset of the paper's suite the env is in (`atari`, "
        "`dmc-proprio`, ...; on a CPU with a note that it is slow, naming `cpu-control` and "
        "`cpu-pixels`); any other env gets `default` (the paper's settings) on a CUDA device "
        "and, without one, `cpu-pixels` for image observations or `cpu-control`, with a note "
        "(a `LucidWarning` in Python). `lucid config ENV` shows the choice.\n",
        presets_markdown(),
    ]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--stdout" in argv:
        sys.stdout.write(text)
        return 0
    if "--check" in argv:
        current = DOC_PATH.read_text() if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is out of date; run `python -m lucid.config_doc`",
                  file=sys.stderr)
            return 1
        return 0
    DOC_PATH.write_text(text)
    print(DOC_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
