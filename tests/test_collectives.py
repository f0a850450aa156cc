"""Collectives over torch.distributed (gloo): two real processes, numpy and torch:cpu backends."""
import json
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from opscope.runtime.backends import resolve
from opscope.runtime.errors import UsageError

WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from opscope.runtime.backends import resolve
    from opscope.runtime.comm import init_process_group, destroy_process_group
    rank, world, port, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    engine = init_process_group(rank, world, f"tcp://127.0.0.1:{port}", backend="gloo", timeout_s=60)
    b = resolve(spec)
    mem = b.memory
    x = mem.to_device(np.arange(4, dtype=np.float32) + 10 * rank)      # backend-native value
    host = lambda v: mem.to_host(v).tolist()
    out = {"engine": engine, "type": type(b.comm.all_reduce(x)).__module__.split(".")[0]}
    out["all_reduce"] = host(b.comm.all_reduce(x))
    out["all_reduce_max"] = host(b.comm.all_reduce(x, op="max"))
    out["all_gather"] = [host(v) for v in b.comm.all_gather(x)]
    out["reduce_scatter"] = host(b.comm.reduce_scatter(x))
    out["broadcast"] = host(b.comm.broadcast(x, src=1))
    b.comm.barrier()
    if rank == 0:
        b.comm.send(x, 1)
    else:
        out["recv"] = host(b.comm.recv(x, 0))
    destroy_process_group()
    print(json.dumps(out))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec, native", [("numpy", "numpy"), ("torch:cpu", "torch")])
def test_two_process_collectives_on_gloo(spec, native, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(port), spec],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    r0, r1 = np.arange(4.0), np.arange(4.0) + 10
    for rank, res in enumerate(results):
        assert res["engine"] == "gloo"
        assert res["type"] == native                      # values come back native to the backend
        assert res["all_reduce"] == (r0 + r1).tolist()
        assert res["all_reduce_max"] == r1.tolist()
        assert res["all_gather"] == [r0.tolist(), r1.tolist()]
        assert res["reduce_scatter"] == (r0 + r1)[rank * 2:(rank + 1) * 2].tolist()
        assert res["broadcast"] == r1.tolist()
    assert results[1]["recv"] == r0.tolist()


def test_collective_without_process_group_is_a_usage_error():
    b = resolve("numpy")
    assert b.comm is b.comm and b.comm.backend is b    # created lazily, once
    with pytest.raises(UsageError, match="init_process_group"):
        b.comm.all_reduce(np.ones(3, np.float32))
