"""The reference backend covers the OpInfo suite (issue 36): numpy/scipy kernels for special functions, scans,
torch.fft's own functions, torch.linalg and the log-sigmoid losses, each checked against eager PyTorch on inputs it
did not choose; views with a storage offset read what eager reads (as_strided over a partial view); SpecAugment's
host-drawn masks train under the seeded rule."""
import numpy as np
import pytest
import torch

from opscope.runtime.backends import resolve
from opscope.runtime.opinfo import check_opinfo, replica
from opscope.runtime.session import compare, open_session

torch.manual_seed(0)
X = torch.randn(4, 5)
POS = torch.rand(4, 5) * 3 + 0.1
UNIT = torch.rand(4, 5) * 1.8 - 0.9
SQUARE = torch.randn(2, 4, 4) + 4 * torch.eye(4)


class Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def run_on_numpy(fn, *inputs):
    """(what numpy gave, what eager gave) for fn(*inputs), every op on numpy (no fallback allowed)."""
    session = open_session("kernel", "numpy", model=Call(fn).eval(), inputs=inputs, allow_fallback=False)
    return session.run_host(), session.eager()


# one line each: the eager call, and its inputs; the op must run on numpy itself (allow_fallback=False)
KERNELS = {
    "exp2": (torch.exp2, X), "signbit": (torch.signbit, X), "erfc": (torch.erfc, X),
    "erfinv": (torch.erfinv, UNIT), "lgamma": (torch.lgamma, POS), "digamma": (torch.digamma, POS),
    "i0e": (torch.special.i0e, X), "ndtri": (torch.special.ndtri, torch.rand(4, 5) * 0.9 + 0.05),
    "bessel_j1": (torch.special.bessel_j1, X), "modified_bessel_k0": (torch.special.modified_bessel_k0, POS),
    "hypot": (torch.hypot, X, POS), "copysign": (torch.copysign, POS, X), "nextafter": (torch.nextafter, X, POS),
    "igamma": (torch.igamma, POS, POS.flip(0)), "zeta": (torch.special.zeta, POS + 1.5, POS),
    "polygamma": (lambda x: torch.polygamma(1, x), X), "mvlgamma": (lambda x: torch.mvlgamma(x, 3), POS + 1.5),
    "chebyshev_t": (torch.special.chebyshev_polynomial_t, UNIT, torch.randint(0, 12, (4, 5))),
    "hermite_h": (torch.special.hermite_polynomial_h, X, torch.randint(0, 6, (4, 5))),
    "cumprod": (lambda x: torch.cumprod(x, 1), X), "cummax": (lambda x: torch.cummax(x, 0), X),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), X), "var_mean": (lambda x: torch.var_mean(x, 1), X),
    "std_mean": (lambda x: torch.std_mean(x, 0, correction=0), X), "aminmax": (lambda x: torch.aminmax(x, dim=1), X),
    "median": (lambda x: torch.median(x, 1), X), "nanmedian": (torch.nanmedian, X),
    "mode": (lambda x: torch.mode(x, 0), X),
    "logsigmoid": (torch.nn.functional.logsigmoid, X * 20),
    "bce_with_logits": (lambda x, t: torch.nn.functional.binary_cross_entropy_with_logits(x, t, pos_weight=POS[0]),
                        X, torch.rand(4, 5)),
    "fft2": (torch.fft.fft2, X), "ifftn": (lambda x: torch.fft.ifftn(x, dim=(0,)), X),
    "irfft2": (torch.fft.irfft2, torch.fft.rfft2(X)), "hfft": (torch.fft.hfft, torch.fft.ifft(X)),
    "ihfft2": (torch.fft.ihfft2, X),
    "det": (torch.linalg.det, SQUARE), "slogdet": (torch.linalg.slogdet, SQUARE), "inv": (torch.linalg.inv, SQUARE),
    "solve": (torch.linalg.solve, SQUARE, torch.randn(2, 4, 3)), "eigvalsh": (torch.linalg.eigvalsh, SQUARE),
    "cholesky": (torch.linalg.cholesky, SQUARE @ SQUARE.mT), "svdvals": (torch.linalg.svdvals, X),
    "pinv": (torch.linalg.pinv, X), "matrix_rank": (torch.linalg.matrix_rank, X), "qr": (torch.linalg.qr, X),
    "lu_factor": (torch.linalg.lu_factor, SQUARE), "solve_triangular":
        (lambda a, b: torch.linalg.solve_triangular(a, b, upper=True), SQUARE, torch.randn(2, 4, 2)),
    "matrix_norm_nuc": (lambda a: torch.linalg.matrix_norm(a, "nuc"), X), "cond": (torch.linalg.cond, SQUARE),
    "isin": (torch.isin, torch.randint(0, 9, (4, 5)), torch.randint(0, 9, (6,))),
    "take": (torch.take, X, torch.tensor([[0, -1], [7, 19]])),
    "bucketize": (lambda x, b: torch.bucketize(x, b, right=True), X, torch.linspace(-2, 2, 7)),
    "searchsorted": (lambda s, v: torch.searchsorted(s, v, side="right"), torch.sort(torch.randn(4, 6)).values, X),
    "isclose": (lambda a, b: torch.isclose(a, b, rtol=0.1, atol=0.05), X, X + torch.randn(4, 5) * 0.1),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_new_kernel_runs_on_numpy_and_matches_eager(name):
    fn, *inputs = KERNELS[name]
    got, want = run_on_numpy(fn, *inputs)
    assert compare(got, want)["max_abs"] <= 1e-4, (name, compare(got, want))


# --- views with a storage offset (as_strided over a partial view) ---------------------------------------------
class StridedView(torch.nn.Module):
    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    def forward(self, x):
        return torch.as_strided(x, (2, 2), (1, 2), self.offset) * 1.0


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
@pytest.mark.parametrize("offset", [None, 0, 3, 10])
def test_as_strided_over_a_partial_view_with_a_storage_offset_reads_what_eager_reads(offset, backend):
    """as_strided's storage_offset counts from the start of the storage, not of the view: offset 0 reads the four
    elements before the view, 10 ones inside it. numpy read the view's own values from its start (offset 0 gave
    5..8 where eager gives 0..3), or past its end (10); a clone of the input hid it from the OpInfo check."""
    base = torch.arange(20.0)
    view = base[5:15]
    want = StridedView(offset)(view)
    session = open_session("strided", backend, model=StridedView(offset).eval(), inputs=(view,), allow_fallback=False)
    got = session.executor.run_host(view)[0]
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


@pytest.fixture(scope="module")
def opinfo_db():
    """PyTorch's OpInfo database, imported once (its import asks `uname -p` in a process)."""
    from opscope.runtime.opinfo import op_db
    return op_db()


def test_the_opinfo_check_passes_the_sample_as_opinfo_built_it(opinfo_db):
    """The replica keeps the storage, the strides and the offset (a clone keeps none of them), so the
    partial-view samples run as OpInfo made them: all three claimed and passing on numpy."""
    base = torch.arange(20.0)
    view = base[5:15]
    r = replica(view)
    assert r.storage_offset() == 5 and r.untyped_storage().nbytes() == base.untyped_storage().nbytes()
    assert r.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    transposed = replica(torch.randn(3, 4).t())
    assert transposed.stride() == (1, 4)
    report = check_opinfo(resolve("numpy"), names=["as_strided.partial_views", "as_strided"])
    assert [(r.status, r.samples) for r in report.results] == [("pass", 3), ("pass", 3)], report.results


# --- SpecAugment: a host-drawn mask written by a boolean index, inside a training step ---------------------------
def wav2vec2(mask_time_prob=0.05):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Wav2Vec2Config(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                      num_feat_extract_layers=2, feat_extract_norm="group", num_conv_pos_embeddings=8,
                                      num_conv_pos_embedding_groups=4, hidden_dropout=0.0, activation_dropout=0.0,
                                      attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                                      mask_time_prob=mask_time_prob, num_labels=3, classifier_proj_size=16)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2ForSequenceClassification(cfg)
    return model, torch.randn(2, 400), torch.tensor([0, 2])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_wav2vec2_with_default_specaugment_trains_on_numpy_like_eager(optimizer):
    """transformers' default SpecAugment (mask_time_prob=0.05): numpy spans, then hidden[mask] = embedding. The
    capture failed (DynamicOutputShapeException: aten.nonzero); now the write is a `where` and the spans come from
    the seeded rule's generator on both sides -- 3 steps within 1e-4 of eager, every op on numpy, and the masking
    is real (the loss is not the unmasked model's). layerdrop keeps its default (0.1): its torch.rand([]) decides a
    Python branch, and draws by the same rule on both sides."""
    from train_sweep import assert_like_eager, by_keyword, three_steps

    from opscope.runtime.train import loss_of
    from opscope.runtime.train.dropout import seeded_dropout

    model, x, y = wav2vec2()
    wrapped, inputs = by_keyword(model, x, y)
    r = three_steps("wav2vec2-specaugment", wrapped, inputs, "numpy", optimizer)
    assert_like_eager(r)
    assert r["placement"]["fallback_ops"] == [], r["placement"]
    assert r["dropout"] == "seeded"             # the host drew its spans under the rule
    plain, px, py = wav2vec2(mask_time_prob=0.0)
    with seeded_dropout():
        unmasked = float(loss_of(plain.train()(input_values=px, labels=py)).detach())
    assert abs(unmasked - r["eager_losses"][0]) > 1e-6, (unmasked, r["eager_losses"])


class Angle(torch.nn.Module):          # aten.angle: no numpy kernel (an op numpy refuses, for the hint)
    def forward(self, x):
        return torch.angle(x) + 1


def test_a_refusal_under_torch_compile_names_the_options_key_not_a_cli_flag():
    """Under torch.compile the way out is `options={"fallback": [...]}`; the hint named `--fallback`, a flag no
    torch.compile call has. The key it names works: the same model then runs, angle on torch."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.tensor([0.5, -2.5, 4.5])
    with pytest.raises(Exception) as err:
        torch.compile(Angle(), backend="opscope", options={"backend": "numpy"})(x)
    text = str(err.value)
    assert 'options={"backend": ..., "fallback": ["torch:cpu"]}' in text and "--fallback" not in text, text
    torch._dynamo.reset()
    out = torch.compile(Angle(), backend="opscope", options={"backend": "numpy", "fallback": ["torch:cpu"]})(x)
    assert out.tolist() == Angle()(x).tolist()


def test_a_refusal_under_the_clis_dynamo_capture_still_names_the_flag(cli, tmp_path):
    """`opscope run --capture dynamo` goes through the same TorchDynamo regions: there the flag is the way out."""
    path = tmp_path / "angle_model.py"
    path.write_text("import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return torch.angle(x) + 1\n\n\n"
                    "def model():\n    return M(), (torch.tensor([0.5, -2.5, 4.5]),)\n")
    r = cli("run", f"{path}:model", "-b", "numpy", "--capture", "dynamo")
    assert r.returncode != 0 and "--fallback torch:cpu" in r.stderr and "options=" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
