"""The training integration, with the real trainers on the CPU (the `train` extra: trl,
transformers, datasets) and a tiny model built here, never downloaded.

The model is a one-layer GPT-2 wired as a fixed bigram table: after the last token of the
chat template's generation prompt it emits one added token whose text is a whole answer
(a fenced kernel, or a `submit` tool call), then the end-of-turn token. So a GRPO step
produces known completions, and the assertions check what the trainer did with them: the
reward KernelReward computed on the real harness, and the tool the environment ran."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the `train` extra (trl, transformers, datasets) is not installed")

from tests.conftest import read  # noqa: E402
from tests.rl_fixtures.common import GOOD, RELU_PROBLEM, shared_pool  # noqa: E402

CORRECT_ON_CPU = 1.5
OVERRIDES = {"target_ms": 10, "warmup_ms": 2, "max_reps": 10}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(answer: str):
    """Byte-level tokenizer (no merges) with the Qwen2.5 chat template TRL knows, plus one
    added token holding `answer`."""
    import trl
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens([answer])
    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=template, padding_side="left")


def bigram_model(tokenizer, answer: str):
    """GPT-2, one layer, whose blocks add nothing: the next token depends on the current
    one only. "\\n" (the end of "<|im_start|>assistant\\n") -> the answer -> "<|im_end|>"."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    n = len(tokenizer)
    config = GPT2Config(vocab_size=n, n_positions=16384, n_embd=n + (-n % 4), n_layer=1, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        tie_word_embeddings=False, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.transformer.h.parameters():
            p.zero_()
        for ln in (model.transformer.h[0].ln_1, model.transformer.h[0].ln_2):
            ln.weight.fill_(1.0)
        model.transformer.wpe.weight.zero_()
        model.transformer.wte.weight.zero_()
        model.transformer.wte.weight[:, :n] = torch.eye(n) * 10
        model.lm_head.weight.zero_()
        newline = tokenizer.convert_tokens_to_ids("Ċ")
        answer_id = tokenizer.convert_tokens_to_ids(answer)
        model.lm_head.weight[answer_id, newline] = 60.0
        model.lm_head.weight[tokenizer.eos_token_id, answer_id] = 60.0
    return model


def grpo_args(tmp_path, **extra):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=8, max_steps=1, learning_rate=1e-6, logging_steps=1,
                      report_to="none", use_cpu=True, save_strategy="no", temperature=1.0, seed=0, **extra)


def prompt_rows(mode: str):
    from datasets import Dataset

    from kernelagent.rl.dataset import build_rows

    rows = build_rows(RELU_PROBLEM, mode=mode, gpu="cpu", max_turns=4)
    return Dataset.from_list([{k: r[k] for k in ("prompt", "problem_id", "problem_source")} for r in rows] * 2)


def test_grpo_step_with_kernel_reward(tmp_path):
    from trl import GRPOTrainer

    from kernelagent.rl import KernelReward
    from tests.rl_fixtures.common import fast_config

    answer = f"```python\n{GOOD}```"
    tokenizer = tiny_tokenizer(answer)
    reward = KernelReward(shared_pool(), eval_config=fast_config())
    trainer = GRPOTrainer(model=bigram_model(tokenizer, answer), reward_funcs=[reward],
                          args=grpo_args(tmp_path), train_dataset=prompt_rows("text"),
                          processing_class=tokenizer)
    trainer.train()
    logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    # both completions were the kernel: the harness found it correct
    assert [b.status for b in reward.last] == ["correct", "correct"] and reward.calls == 1
    assert logged["rewards/kernel_reward/mean"] == pytest.approx(CORRECT_ON_CPU)
    assert logged["kernel/correct"] == 1.0  # forwarded through log_metric
    assert math.isfinite(logged["train_loss"])


def test_grpo_step_through_the_environment_factory(tmp_path):
    from trl import GRPOTrainer

    from kernelagent.rl.tool_env import KernelToolEnv

    answer = "<tool_call>\n" + json.dumps({"name": "submit", "arguments": {"code": GOOD}}) + "\n</tool_call>"
    tokenizer = tiny_tokenizer(answer)
    made: list[KernelToolEnv] = []

    def factory():
        env = KernelToolEnv(shared_pool(), trials=2, quick_trials=2, eval_overrides=OVERRIDES, max_turns=4)
        made.append(env)
        return env

    trainer = GRPOTrainer(model=bigram_model(tokenizer, answer), args=grpo_args(tmp_path, max_tool_calling_iterations=2),
                          train_dataset=prompt_rows("tools"), processing_class=tokenizer,
                          environment_factory=factory)
    trainer.train()
    logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    used = [e for e in made if e.calls]
    assert len(used) == 2  # one environment per rollout, each ran the model's submit call
    for env in used:
        assert env.calls[0]["tool"] == "submit" and env.calls[0]["passed"]
        assert env.done and env.final.correct and env.final.reward == pytest.approx(CORRECT_ON_CPU)
        assert env.problem.source == read(RELU_PROBLEM)
    assert logged["rewards/KernelToolEnv/mean"] == pytest.approx(CORRECT_ON_CPU)
    assert logged["tools/call_frequency"] > 0


def test_sft_step_on_exported_tool_rows(tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from kernelagent.orchestrate import optimize
    from kernelagent.models import ScriptedModel
    from kernelagent.rl.sft import export_sft

    calls = [{"content": "Compile first.", "tool_calls": [{"id": "c1", "name": "compile",
                                                           "arguments_json": json.dumps({"code": GOOD})}]},
             {"content": "It builds; submitting.", "tool_calls": [{"id": "c2", "name": "submit",
                                                                    "arguments_json": "{}"}]}]
    optimize(RELU_PROBLEM, ScriptedModel(calls), mode="tools", max_turns=4, out=tmp_path / "run",
             evaluator=shared_pool(), trials=2, quick_trials=2, eval_overrides=OVERRIDES)
    stats = export_sft([tmp_path / "run"], 0.0, tmp_path / "sft.jsonl", include_test=True)
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert stats["rows"] == 1 and rows[0]["mode"] == "tools"
    roles = [m["role"] for m in rows[0]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert rows[0]["messages"][2]["tool_calls"][0]["function"] == {"name": "compile", "arguments": {"code": GOOD}}
    assert rows[0]["messages"][3]["name"] == "compile"
    assert [t["function"]["name"] for t in json.loads(rows[0]["tools"])] == [
        "read_reference", "compile", "run_tests", "profile", "submit"]

    tokenizer = tiny_tokenizer("unused")
    dataset = Dataset.from_list([{"messages": r["messages"], "tools": r["tools"]} for r in rows] * 2)
    args = SFTConfig(output_dir=str(tmp_path / "sft-out"), per_device_train_batch_size=2, max_steps=1,
                     logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", max_length=None)
    trainer = SFTTrainer(model=bigram_model(tokenizer, "unused"), args=args, train_dataset=dataset,
                         processing_class=tokenizer)
    text = tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    # the tokenized row holds the tool schemas, the tool calls and the tool results
    assert "<tools>" in text and '"name": "run_tests"' in text
    assert '<tool_call>\n{"name": "compile", "arguments": {"code": ' in text
    # (Arrow gives every row's arguments one schema: a call that left `code` out reads
    # {"code": null}, which the tools take the same way, as "reuse the latest candidate")
    assert "<tool_response>" in text and '{"name": "submit", "arguments": {"code": null}}' in text
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(math.isfinite(x) and x > 0 for x in losses)
