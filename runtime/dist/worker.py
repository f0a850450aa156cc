"""The child process of `launch`: one rank; its records go to stdout after a marker line prefix.
The tools start profiler/hybrid_rank.py instead, which is this with the --shared-dir writer."""
from __future__ import annotations

import os
import sys


def main(records=None) -> int:
    """`records`: what keeps the rank's records (job.run_rank); None keeps them in memory."""
    from ..errors import OpscopeError, first_line
    from .job import ENV_JOB, DistJob, run_rank, torchrun_env
    from .launch import emit
    from .trainer import CollectiveFailed

    env = torchrun_env()
    if env is None or ENV_JOB not in os.environ:
        print("opscope: error: the dist worker runs under `opscope train --hybrid` or torchrun", file=sys.stderr)
        return 2
    rank = env["rank"]
    try:
        job = DistJob.from_json(os.environ[ENV_JOB])
        for record in run_rank(job, rank, env["world_size"], records):
            emit(record)
    except CollectiveFailed as e:
        emit({"kind": "error", "rank": rank, "message": str(e), "collective": True})
        return 1
    except OpscopeError as e:
        emit({"kind": "error", "rank": rank, "message": str(e)})
        return e.exit_code
    except Exception as e:  # noqa: BLE001 -- the launcher needs one line, not a traceback
        emit({"kind": "error", "rank": rank, "message": f"{type(e).__name__}: {first_line(e)}"})
        return 1
    return 0

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every record is out and the group is destroyed: skip interpreter finalization, where torch's
    # and gloo's C++ threads can still abort (SIGABRT) a rank whose work is complete.
    os._exit(code)
