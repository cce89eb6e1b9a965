"""Episodes of verl's agent loop on awm, run inside the verl environment (tests/verl_env.py) by
tests/test_verl.py: ``python tests/verl_episodes.py INSTANCES_FILE`` prints one JSON object.

verl's real ``AgentLoopBase`` (its Continuous Token tokenization, its ``AgentLoopOutput``)
drives :class:`awm.integrations.verl_agent.AwmAgentLoop`; the rollout server is scripted: it answers
each generate call with the next reply of a script, as token ids of a word-level tokenizer whose
words include whole tool calls (trainer/tiny.py), with a ChatML chat template.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from awm.integrations.verl_agent import AwmAgentLoop
from awm.trainer.tiny import build_tokenizer

# The verifier of add_note wants the body "milk, eggs"; a word of the tokenizer holds no space,
# so the call writes it as a JSON escape.
ADD = r'<tool_call>{"name":"add_note","arguments":{"title":"groceries","body":"milk,\u0020eggs"}}</tool_call>'
WRONG = '<tool_call>{"name":"add_note","arguments":{"title":"groceries","body":"milk,"}}</tool_call>'
LIST = '<tool_call>{"name":"list_notes","arguments":{}}</tool_call>'
CHATML = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
          "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


class ScriptedServer:
    """The rollout server's ``generate``: the next scripted reply, with a log-prob per token."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


async def episode(tokenizer: Any, instances_file: str, task_id: str, replies: list[str],
                  trajectories: str | None = None) -> dict[str, Any]:
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 1024}}})
    server = ScriptedServer(tokenizer, replies)
    loop = AwmAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                        processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})),
                        awm={"instances_file": instances_file, "max_turns": 3, "max_steps": 5,
                             "trajectories": trajectories})
    out = await loop.run({"temperature": 1.0}, extra_info={"env": "notes", "task_id": task_id})
    return {"reward": out.reward_score, "response_mask": out.response_mask, "prompt_len": len(out.prompt_ids),
            "response_len": len(out.response_ids), "logprobs": out.response_logprobs, "extra": out.extra_fields,
            "generate_calls": len(server.prompts), "prompt_grows": all(
                b[:len(a)] == a for a, b in zip(server.prompts, server.prompts[1:]))}


async def main(instances_file: str, trajectories: str | None) -> dict[str, Any]:
    words = ["Added", "the", "note.", "Done."]
    tokenizer = build_tokenizer(words, [ADD, WRONG, LIST])
    tokenizer.chat_template = CHATML
    return {
        "complete": await episode(tokenizer, instances_file, "add_note", [ADD, "Added the note."], trajectories),
        "wrong": await episode(tokenizer, instances_file, "add_note", [WRONG, "Done."], trajectories),
        "turns": await episode(tokenizer, instances_file, "add_note", [LIST, LIST, LIST], trajectories),
        "masked": await episode(tokenizer, instances_file, "kills_itself", ["Done."], trajectories),
    }


if __name__ == "__main__":  # verl_episodes.py INSTANCES_FILE [TRAJECTORIES]
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))))
