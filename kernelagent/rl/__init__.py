"""kernelagent for training kernel models: verifiable rewards, a TRL reward function, a
multi-turn environment over the agent's own loop, prompt datasets, a reward service and
fine-tuning data from agent runs. Importing this package imports neither torch nor ray.

    from kernelagent.rl import KernelReward, RewardConfig, reward_from_result
    from kernelagent.rl import KernelEnv, KernelGymEnv, KernelToolEnv, export_sft, build_rows
"""

from kernelagent.rl.reward import RewardBreakdown, RewardConfig, reward_from_result
from kernelagent.rl.trl import DevicePlacementError, KernelReward, extract_candidate, make_reward_fn

_LAZY = {
    "KernelEnv": "kernelagent.rl.env",
    "KernelGymEnv": "kernelagent.rl.env",
    "KernelToolEnv": "kernelagent.rl.tool_env",
    "Judge": "kernelagent.rl.judge",
    "JudgeScore": "kernelagent.rl.judge",
    "build_rows": "kernelagent.rl.dataset",
    "write_prompts": "kernelagent.rl.dataset",
    "export_sft": "kernelagent.rl.sft",
    "RewardService": "kernelagent.rl.service",
    "RemoteReward": "kernelagent.rl.service",
    "RayBackend": "kernelagent.rl.ray_backend",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = ["DevicePlacementError", "KernelReward", "RewardBreakdown", "RewardConfig", "extract_candidate", "make_reward_fn",
           "reward_from_result", *_LAZY]
