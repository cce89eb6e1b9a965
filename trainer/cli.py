"""``awm agent``, ``awm train``, ``awm eval``, ``awm warmstart`` and ``awm verify`` (merged into
the ``awm`` command by awm/cli.py's LAZY_COMMANDS).

This module only registers the commands; each lives in a module of its own (trainer/cmd_agent.py,
cmd_train.py, cmd_eval.py, cmd_warmstart.py, cmd_verify.py; the options they share in
cmd_options.py). Their imports stay inside the commands, so ``awm`` without the trainer extra (no
torch) still starts.
Exit codes: 0 success, 1 failed episode / run, 2 bad input, 3 policy endpoint unavailable.
"""

from __future__ import annotations

import typer

from awm.trainer.cmd_agent import agent
from awm.trainer.cmd_eval import eval_command
from awm.trainer.cmd_train import train
from awm.trainer.cmd_verify import verify_command
from awm.trainer.cmd_warmstart import warmstart_command

__all__ = ["agent", "eval_command", "train", "trainer_app", "verify_command", "warmstart_command"]

trainer_app = typer.Typer()
trainer_app.command()(agent)
trainer_app.command()(train)
trainer_app.command("eval")(eval_command)
trainer_app.command("warmstart")(warmstart_command)
trainer_app.command("verify")(verify_command)
