"""Do the learning guards catch a broken agent? Runs one guard of tests/test_learning.py
(its config, budget and bar, `GUARDS`) with one deliberate mistake patched into lucid at run
time, and reports the mean return of the last 10 episodes against the guard's bar. A guard
worth its time ends below the bar under every mutation; the mutation `none` is the guard as
the test runs it (`--seed` for other seeds, `--train KEY=VALUE` to explore a setting).

    OMP_NUM_THREADS=1 python benchmarks/guard_mutants.py cartpole advantage-sign --out r.json

Mutations (each replaces a function lucid.agent calls, a method of a network it builds, or a
config value, so the rest of the update is as it is):
  advantage-sign        the actor's advantage (R - v) / max(1, S) negated: REINFORCE makes
                        worse actions likelier, the dynamics path climbs down the return
  critic-symlog-target  the critic (imagined and replayed value losses) trained toward
                        symlog(R) as if it were R, i.e. the target symlog'd twice: values
                        end up in the wrong space and the λ-returns bootstrap from them
                        (the cartpole guard does not catch it: seed 0 passed, later)
  encoder-blind         the image encoder sees zeros instead of the image (the decoder still
                        reconstructs it): nothing the policy sees tells the cue
  actor-frozen          the actor's learning rate 0: the policy stays the initial one
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # lucid, and the guards with their envs


def _advantage_sign():
    import lucid.agent as agent
    original = agent.actor_loss

    def actor_loss(actor, params, action, ret, value, weight, scale, tcfg):
        # (R' - v) = -(R - v) with R' = 2 sg(v) - R: the gradient through R is negated too
        flipped = 2.0 * value[:-1].detach() - ret
        return original(actor, params, action, flipped, value, weight, scale, tcfg)
    agent.actor_loss = actor_loss


def _critic_symlog_target():
    import lucid.agent as agent
    from lucid.nets import symlog
    critic_loss, replay_critic_loss = agent.critic_loss, agent.replay_critic_loss

    def imagined(critic, logits, feat, ret, weight, tcfg, probs=None):
        return critic_loss(critic, logits, feat, symlog(ret), weight, tcfg, probs)

    def replayed(critic, feat, ret, last, tcfg, grad=False):
        return replay_critic_loss(critic, feat, symlog(ret), last, tcfg, grad=grad)
    agent.critic_loss, agent.replay_critic_loss = imagined, replayed


def _encoder_blind():
    import torch
    from lucid.nets import ImageEncoder
    forward = ImageEncoder.forward
    ImageEncoder.forward = lambda self, img: forward(self, torch.zeros_like(img))


MUTATIONS = {
    "none": lambda: None,
    "advantage-sign": _advantage_sign,
    "critic-symlog-target": _critic_symlog_target,
    "encoder-blind": _encoder_blind,
    "actor-frozen": None,  # a config key, set in main
}


def main(argv: list[str] | None = None) -> int:
    from test_learning import GUARDS, guard_config
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("guard", choices=sorted(GUARDS))
    parser.add_argument("mutation", choices=list(MUTATIONS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="env steps (the guard's budget)")
    parser.add_argument("--train", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.* setting over the guard's (to explore a guard)")
    parser.add_argument("--run-dir", default=None, help="default: a temporary directory")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)

    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from lucid.train import Trainer

    guard = GUARDS[args.guard]
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix=f"guard-{args.guard}-"))
    train = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.train)}
    if args.mutation == "actor-frozen":
        train["actor_lr"] = 0.0
    cfg = guard_config(args.guard, args.seed, run_dir, steps=args.steps, train=train,
                       threads=torch.get_num_threads())
    if MUTATIONS[args.mutation] is not None:
        MUTATIONS[args.mutation]()
    start = time.time()
    trainer = Trainer(cfg)
    trainer.run()
    seconds = time.time() - start
    returns = [json.loads(line)["return"] for line in open(run_dir / "episodes.jsonl")]
    windows = [statistics.mean(returns[i - 10:i]) for i in range(10, len(returns) + 1)]
    final = windows[-1] if windows else float("nan")
    out = {"guard": args.guard, "mutation": args.mutation, "seed": args.seed, "train": train,
           "bar": guard["bar"], "final_mean10": final, "best_mean10": max(windows, default=None),
           "passed": final >= guard["bar"], "env_steps": trainer.counters["env_steps"],
           "budget": cfg.run.steps, "updates": trainer.counters["updates"],
           "episodes": len(returns), "seconds": round(seconds, 1), "run_dir": str(run_dir)}
    print(f"{args.guard} / {args.mutation} (seed {args.seed}): mean of the last 10 episodes "
          f"{final:.2f} against the bar {guard['bar']:g} "
          f"({'PASSES' if out['passed'] else 'fails'}) after {out['env_steps']} of "
          f"{out['budget']} env steps, {out['seconds']:.0f} s; best window "
          f"{out['best_mean10']}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
