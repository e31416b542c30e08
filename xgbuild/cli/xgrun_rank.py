"""The entry point of one rank that `xgrun --nproc` starts: `xgrun` with a heartbeat.

The heartbeat to the launcher starts first, before torch (seconds to import) loads, so the
launcher can tell a slow start from a hung rank. Then it is plain `xgrun`, which reads the rank
from RANK / WORLD_SIZE like under torchrun.
"""

from __future__ import annotations

from ..runtime.launch import start_heartbeat
from ..settings import RunSettings, SettingsError, dist_env, use_triton_interpreter


def main() -> None:
    try:
        env = dist_env()
    except SettingsError:
        env = None          # xgrun reports the bad variable itself
    if env is not None and env.heartbeat_fd is not None:
        start_heartbeat(env.heartbeat_fd)
    if RunSettings.from_env().spmd_kernels == "interpret":
        use_triton_interpreter()     # read when Triton is imported: before anything imports it
    from .xgrun import main as xgrun_main
    xgrun_main()


if __name__ == "__main__":
    main()
