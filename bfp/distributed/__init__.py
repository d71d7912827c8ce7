"""Distributed training with low-precision gradient all-reduce (CPD's second half).

    env        rank, world size and device from torchrun / srun / RANK... variables; the process group
    reduce     RoundedReduce: N workers' gradients summed in a format (ring or sequential order, APS, Kahan)
    hook       the same reduction as a DDP communication hook
    ddp        DDPStep: the step strategy of one worker per process
    emulated   EmulatedStep: N workers per process (--emulate-node)

Numerics and commands: docs/distributed.md.
"""
from .ddp import DDPStep
from .emulated import EmulatedStep
from .env import DistEnv, DistEnvError, read_env
from .hook import RoundedHookState, rounded_allreduce_hook
from .reduce import ORDERS, RoundedReduce, check_grad_format

__all__ = ["DDPStep", "DistEnv", "DistEnvError", "EmulatedStep", "ORDERS", "RoundedHookState", "RoundedReduce",
           "check_grad_format", "read_env", "rounded_allreduce_hook"]
