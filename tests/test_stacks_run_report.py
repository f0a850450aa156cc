"""`opscope run` on a compiler stack prints its regions (nodes, edge bytes) and the nodes left out of them with
the reason, in the text a user reads, not only in --json."""
import pytest


@pytest.mark.multiprocess
def test_run_text_names_each_region_and_every_node_left_out_and_why(cli, tmp_path):
    pytest.importorskip("onnxruntime")
    chip = tmp_path / "ort-no-gelu.toml"
    chip.write_text('[backend]\nname = "ort-no-gelu"\nimplementation = "onnxruntime"\nfallback = "torch:cpu"\n'
                    '[backend.options]\nthreads = 1\n[operators]\nunsupported = ["gelu"]\n')
    r = cli("run", "demo:gpt", "-b", chip, env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = [ln.split("│")[1:4] for ln in lines if ln.startswith("│ region")]
    assert [(name.strip(), backend.strip()) for name, backend, _ in rows] == \
        [(f"region{i}", "ort-no-gelu") for i in range(5)]              # 4 refused gelus cut 5 regions
    assert sum(int(n) for _, _, n in rows) == 78                        # 82 nodes, the 4 gelus outside
    start, end = lines.index("left out of regions"), lines.index("fell back")
    left = [ln for ln in lines[start:end] if ln.startswith("│ gelu")]
    assert len(left) == 4 and all("marked unsupported in the description" in ln for ln in left)
