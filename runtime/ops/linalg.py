"""torch.linalg (and its older spellings: qr, cholesky, pinverse, logdet, triangular_solve): numpy.linalg (and
LAPACK's getrf through scipy) reference kernels over batches of matrices, each with a cubic cost model.

Kernels factor in float64 (complex128) and the result is stored in the dtype capture recorded: the answer is the
exact one, so a float32 comparison measures only the float32 kernel's own rounding. Decompositions that are
unique only up to signs or phases (svd's U and V, eigh's vectors, qr's Q and R) come from the same LAPACK
routines ATen calls (qr's Householder signs, getrf's pivots), which fix those choices the same way. Eigenvectors
and singular vectors are left to the fallback: LAPACK builds choose their signs differently (numpy's OpenBLAS
and torch's MKL disagree on about half of random matrices), so no kernel here could promise eager's.
"""
from __future__ import annotations

import numpy as np
import torch

from ..samples import F32_64, SAMPLES, C, F, Sample
from .registry import COMPLEX, define

aten = torch.ops.aten
LINALG = frozenset({"float32", "float64"}) | COMPLEX


def _cubic(k=1):
    """k * batch * m * n * min(m, n): a factorization's FLOPs, by its first input's shape."""
    def flops(node):
        shape = node.input_meta[0].shape
        if len(shape) < 2:
            return node.input_meta[0].numel
        m, n = shape[-2], shape[-1]
        batch = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
        return int(k * batch * m * n * min(m, n))
    return flops


def _wide(a):
    a = np.asarray(a)
    return a.astype(np.complex128) if a.dtype.kind == "c" else a.astype(np.float64)


def _info(a):
    return np.zeros(np.shape(a)[:-2], dtype=np.int32)


def _as_vector(A, B):
    # torch.linalg.solve treats B as a batch of vectors when B is 1-d or its shape is A's without the last dim
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


def _solve(A, B, left=True):
    A, B = _wide(A), _wide(B)
    if not left:                             # X A = B  <=>  A^T X^T = B^T
        return np.swapaxes(_solve(np.swapaxes(A, -1, -2), np.swapaxes(B, -1, -2)), -1, -2)
    if _as_vector(A, B):
        return np.linalg.solve(A, B[..., None])[..., 0]
    return np.linalg.solve(*_batch_pair(A, B))


def _batch_pair(A, B):
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    return np.broadcast_to(A, batch + A.shape[-2:]), np.broadcast_to(B, batch + B.shape[-2:])


@define("linalg_det", "compute", aten=("aten.linalg_det", "aten.det"), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_det(A):
    return np.linalg.det(_wide(A))


@define("linalg_slogdet", "compute", aten=("aten.linalg_slogdet", "aten.slogdet"), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_slogdet(A):
    sign, logabs = np.linalg.slogdet(_wide(A))
    return [sign, logabs]


@define("logdet", "compute", aten=("aten.logdet",), flops=_cubic(2 / 3), dtypes=LINALG)
def logdet(self):
    """log det: nan for a negative determinant, -inf for a singular matrix."""
    sign, logabs = np.linalg.slogdet(_wide(self))
    if np.iscomplexobj(sign):
        return np.log(sign) + logabs
    return np.where(sign < 0, np.nan, np.where(sign == 0, -np.inf, logabs))


@define("linalg_inv", "compute", aten=("aten.linalg_inv", "aten.inverse"), flops=_cubic(2), dtypes=LINALG)
def linalg_inv(A):
    return np.linalg.inv(_wide(A))


@define("linalg_inv_ex", "compute", aten=("aten.linalg_inv_ex",), flops=_cubic(2), dtypes=LINALG)
def linalg_inv_ex(A, check_errors=False):
    return [np.linalg.inv(_wide(A)), _info(A)]


@define("linalg_solve", "compute", aten=("aten.linalg_solve",), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_solve(A, B, left=True):
    return _solve(A, B, left)


@define("linalg_solve_ex", "compute", aten=("aten.linalg_solve_ex",), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_solve_ex(A, B, left=True, check_errors=False):
    return [_solve(A, B, left), _info(A)]


def _cholesky(A, upper):
    L = np.linalg.cholesky(_wide(A))
    return np.conj(np.swapaxes(L, -1, -2)) if upper else L


@define("linalg_cholesky", "compute", aten=("aten.linalg_cholesky", "aten.cholesky"), flops=_cubic(1 / 3),
        dtypes=LINALG)
def linalg_cholesky(A, upper=False):
    return _cholesky(A, upper)


@define("linalg_cholesky_ex", "compute", aten=("aten.linalg_cholesky_ex",), flops=_cubic(1 / 3), dtypes=LINALG)
def linalg_cholesky_ex(A, upper=False, check_errors=False):
    return [_cholesky(A, upper), _info(A)]


@define("cholesky_inverse", "compute", aten=("aten.cholesky_inverse",), flops=_cubic(1), dtypes=LINALG)
def cholesky_inverse(self, upper=False):
    """(L L^H)^-1 from the Cholesky factor L (U^H U from U when upper); the other triangle is not read."""
    f = np.triu(_wide(self)) if upper else np.tril(_wide(self))
    ft = np.conj(np.swapaxes(f, -1, -2))
    return np.linalg.inv(ft @ f if upper else f @ ft)


@define("cholesky_solve", "compute", aten=("aten.cholesky_solve",), flops=_cubic(2), dtypes=LINALG)
def cholesky_solve(self, input2, upper=False):
    f = np.triu(_wide(input2)) if upper else np.tril(_wide(input2))
    ft = np.conj(np.swapaxes(f, -1, -2))
    return np.linalg.solve(*_batch_pair(ft @ f if upper else f @ ft, _wide(self)))


def _triangular(A, B, upper, left=True, unitriangular=False, transpose=False):
    A, B = _batch_pair(_wide(A), _wide(B))
    A = np.triu(A) if upper else np.tril(A)
    if unitriangular:
        A = A * (1 - np.eye(A.shape[-1])) + np.eye(A.shape[-1])
    if transpose:
        A = np.swapaxes(A, -1, -2)
    if not left:
        return np.swapaxes(np.linalg.solve(np.swapaxes(A, -1, -2), np.swapaxes(B, -1, -2)), -1, -2)
    return np.linalg.solve(A, B)


@define("linalg_solve_triangular", "compute", aten=("aten.linalg_solve_triangular",), flops=_cubic(1),
        dtypes=LINALG)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    return _triangular(self, B, upper, left, unitriangular)


@define("triangular_solve", "compute", aten=("aten.triangular_solve",), flops=_cubic(1), dtypes=LINALG)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    """(solution of A X = self, A broadcast to the batch), A the triangle it was solved with."""
    X = _triangular(A, self, upper, True, unitriangular, transpose)
    return [X, np.broadcast_to(_wide(A), X.shape[:-2] + np.shape(A)[-2:]).copy()]


@define("linalg_eigvalsh", "compute", aten=("aten.linalg_eigvalsh",), flops=_cubic(4), dtypes=LINALG)
def linalg_eigvalsh(self, UPLO="L"):
    return np.linalg.eigvalsh(_wide(self), UPLO=UPLO)


@define("linalg_eigvals", "compute", aten=("aten.linalg_eigvals",), flops=_cubic(10), dtypes=LINALG)
def linalg_eigvals(self):
    return np.linalg.eigvals(_wide(self)).astype(np.complex128)


@define("linalg_svdvals", "compute", aten=("aten.linalg_svdvals",), flops=_cubic(4), dtypes=LINALG)
def linalg_svdvals(A, driver=None):
    return np.linalg.svd(_wide(A), compute_uv=False)


def _tolerances(s, A, atol, rtol):
    """torch's rule: tol = max(atol, rtol * largest singular value); rtol defaults to eps * max(m, n), or 0 when
    only a positive atol is given."""
    eps = np.finfo(np.float32 if A.dtype in (np.float32, np.complex64) else np.float64).eps
    smax = np.max(s, axis=-1, initial=0.0) if s.shape[-1] else np.zeros(s.shape[:-1])
    a = 0.0 if atol is None else np.asarray(atol, dtype=np.float64)
    if rtol is None:
        rtol = eps * max(A.shape[-2:]) if atol is None or np.all(np.asarray(atol) <= 0) else 0.0
    return np.maximum(a, np.asarray(rtol, dtype=np.float64) * smax)


def _singular(A, hermitian):
    return np.abs(np.linalg.eigvalsh(_wide(A))) if hermitian else np.linalg.svd(_wide(A), compute_uv=False)


@define("linalg_matrix_rank", "compute", aten=("aten.linalg_matrix_rank",), flops=_cubic(4), dtypes=LINALG)
def linalg_matrix_rank(input, tol=None, hermitian=False, *, atol=None, rtol=None):
    if isinstance(tol, bool):               # (self, hermitian) never happens; guard the positional shapes
        tol, hermitian = None, tol
    if tol is not None:                     # .default / .tol_tensor: an absolute tolerance
        atol, rtol = tol, 0.0
    s = _singular(input, hermitian)
    t = _tolerances(s, np.asarray(input), atol, rtol)
    return np.sum(s > np.expand_dims(t, -1), axis=-1).astype(np.int64)


def _pinv(A, atol, rtol, hermitian):
    stored, A = np.asarray(A), _wide(A)
    if hermitian:
        w, v = np.linalg.eigh(A)
        s = np.abs(w)
        t = _tolerances(s, stored, atol, rtol)
        inv = np.where(s > np.expand_dims(t, -1), 1.0 / np.where(w == 0, 1, w), 0.0)
        return (v * inv[..., None, :]) @ np.conj(np.swapaxes(v, -1, -2))
    u, s, vh = np.linalg.svd(A, full_matrices=False)
    t = _tolerances(s, stored, atol, rtol)
    inv = np.where(s > np.expand_dims(t, -1), 1.0 / np.where(s == 0, 1, s), 0.0)
    return np.conj(np.swapaxes(vh, -1, -2)) @ (inv[..., :, None] * np.conj(np.swapaxes(u, -1, -2)))


@define("linalg_pinv", "compute", aten=("aten.linalg_pinv",), flops=_cubic(14), dtypes=LINALG)
def linalg_pinv(self, rcond=None, hermitian=False, *, atol=None, rtol=None):
    if rcond is not None:                   # .default / .rcond_tensor: rcond is a relative tolerance
        atol, rtol = 0.0, rcond
    return _pinv(self, atol, rtol, hermitian)


@define("pinverse", "compute", aten=("aten.pinverse",), flops=_cubic(14), dtypes=LINALG)
def pinverse(self, rcond=1e-15):
    return _pinv(self, 0.0, rcond, False)


@define("linalg_cond", "compute", aten=("aten.linalg_cond",), flops=_cubic(4), dtypes=LINALG)
def linalg_cond(self, p=None):
    return np.linalg.cond(_wide(self), p)


@define("linalg_matrix_norm", "reduction", aten=("aten.linalg_matrix_norm",), flops=_cubic(4), dtypes=LINALG)
def linalg_matrix_norm(self, ord="fro", dim=(-2, -1), keepdim=False, dtype=None):
    return np.linalg.norm(_wide(self), ord=ord, axis=tuple(dim), keepdims=keepdim)


@define("linalg_tensorinv", "compute", aten=("aten.linalg_tensorinv",), flops=_cubic(2), dtypes=LINALG)
def linalg_tensorinv(self, ind=2):
    return np.linalg.tensorinv(_wide(self), ind=ind)


@define("linalg_tensorsolve", "compute", aten=("aten.linalg_tensorsolve",), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_tensorsolve(self, other, dims=None):
    return np.linalg.tensorsolve(_wide(self), _wide(other), axes=dims)


def _qr(A, mode):
    q, r = np.linalg.qr(_wide(A), mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        return [np.zeros((0,), dtype=q.dtype), r]
    return [q, r]


@define("linalg_qr", "compute", aten=("aten.linalg_qr",), flops=_cubic(4), dtypes=LINALG)
def linalg_qr(A, mode="reduced"):
    return _qr(A, mode)


@define("qr", "compute", aten=("aten.qr",), flops=_cubic(4), dtypes=LINALG)
def qr(self, some=True):
    return _qr(self, "reduced" if some else "complete")


def _lu_factor(A):
    """(LU, 1-based int32 pivots) per matrix: LAPACK getrf's answer (partial pivoting), as ATen returns it."""
    from scipy.linalg.lapack import get_lapack_funcs
    A = _wide(A)
    batch, (m, n) = A.shape[:-2], A.shape[-2:]
    lu = np.empty_like(A)
    piv = np.empty(batch + (min(m, n),), dtype=np.int32)
    getrf, = get_lapack_funcs(("getrf",), (A,))
    for i in np.ndindex(*batch):
        lu[i], p, _ = getrf(A[i])
        piv[i] = p[:min(m, n)] + 1
    return lu, piv


@define("linalg_lu_factor", "compute", aten=("aten.linalg_lu_factor",), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_lu_factor(A, pivot=True):
    return list(_lu_factor(A))


@define("linalg_lu_factor_ex", "compute", aten=("aten.linalg_lu_factor_ex", "aten._lu_with_info"),
        flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    lu, piv = _lu_factor(A)
    return [lu, piv, _info(A)]


def _permutation(piv, m):
    """The permutation matrix P of LAPACK's row swaps (1-based), so that A = P L U."""
    perm = np.arange(m)
    for i, p in enumerate(piv):
        perm[[i, p - 1]] = perm[[p - 1, i]]
    P = np.zeros((m, m))
    P[perm, np.arange(m)] = 1
    return P


def _unpack(lu, piv):
    m, n = lu.shape[-2:]
    k = min(m, n)
    L = np.tril(lu, -1)[..., :, :k] + np.eye(m, k)
    U = np.triu(lu)[..., :k, :]
    P = np.empty(lu.shape[:-2] + (m, m))
    for i in np.ndindex(*lu.shape[:-2]):
        P[i] = _permutation(piv[i], m)
    return P, L, U


@define("linalg_lu", "compute", aten=("aten.linalg_lu",), flops=_cubic(2 / 3), dtypes=LINALG)
def linalg_lu(A, pivot=True):
    return list(_unpack(*_lu_factor(A)))


@define("addbmm", "compute", aten=("aten.addbmm",),
        flops=lambda n: 2 * n.input_meta[1].numel * n.input_meta[2].shape[-1], dtypes=LINALG)
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    """beta self + alpha sum_b batch1[b] @ batch2[b] (beta 0 ignores self, NaN included): one (n, b k) @ (b k, p)
    product in the stored dtype -- a float64 sum differs from float32 BLAS by more than float32's tolerance."""
    b, n, k = batch1.shape
    total = np.transpose(batch1, (1, 0, 2)).reshape(n, b * k) @ batch2.reshape(b * k, -1)
    return alpha * total if beta == 0 else beta * np.asarray(self) + alpha * total


_POS = dict(lo=0.5, hi=2.0)      # a 1x1 positive matrix is positive definite; a triangle with no zero on its diagonal
SAMPLES.update({
    "linalg_det": Sample(aten.linalg_det.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "linalg_slogdet": Sample(aten.linalg_slogdet.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "logdet": Sample(aten.logdet.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "linalg_inv": Sample(aten.linalg_inv.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "linalg_inv_ex": Sample(aten.linalg_inv_ex.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "linalg_solve": Sample(aten.linalg_solve.default, [(F(3, 3), F(3, 2)), (F(2, 4, 4), F(2, 4)),
                                                       C(F(3, 3), F(2, 3), left=False)], F32_64),
    "linalg_solve_ex": Sample(aten.linalg_solve_ex.default, [(F(3, 3), F(3, 2)), (F(2, 4, 4), F(4, 1))], F32_64),
    "linalg_solve_triangular": Sample(aten.linalg_solve_triangular.default,
                                      [C(F(3, 3, lo=1, hi=2), F(3, 2), upper=True),
                                       C(F(2, 3, 3, lo=1, hi=2), F(2, 3), upper=False, left=False,
                                         unitriangular=True)], F32_64),
    "triangular_solve": Sample(aten.triangular_solve.default, [(F(3, 2), F(3, 3, lo=1, hi=2)),
                                                               (F(2, 3, 1), F(3, 3, lo=1, hi=2), False, True)],
                               F32_64),
    "linalg_cholesky": Sample(aten.linalg_cholesky.default, [(F(1, 1, **_POS),), C(F(3, 1, 1, **_POS), upper=True)],
                              F32_64),
    "linalg_cholesky_ex": Sample(aten.linalg_cholesky_ex.default, [(F(1, 1, **_POS),), (F(2, 1, 1, **_POS),)], F32_64),
    "cholesky_inverse": Sample(aten.cholesky_inverse.default, [(F(3, 3, **_POS),), (F(2, 3, 3, **_POS), True)],
                               F32_64),
    "cholesky_solve": Sample(aten.cholesky_solve.default,
                             [(F(3, 2), F(3, 3, **_POS)), (F(2, 3, 1), F(3, 3, **_POS), True)], F32_64),
    "linalg_eigvalsh": Sample(aten.linalg_eigvalsh.default, [(F(3, 3),), (F(2, 4, 4), "U")], F32_64),
    "linalg_qr": Sample(aten.linalg_qr.default, [(F(3, 4),), (F(2, 4, 3), "complete")], F32_64),
    "qr": Sample(aten.qr.default, [(F(3, 4),), (F(2, 4, 3), False)], F32_64),
    "linalg_lu_factor": Sample(aten.linalg_lu_factor.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "linalg_lu_factor_ex": Sample(aten.linalg_lu_factor_ex.default, [(F(3, 3),), (F(2, 4, 4),)], F32_64),
    "linalg_lu": Sample(aten.linalg_lu.default, [(F(3, 3),), (F(2, 4, 3),)], F32_64),
    "linalg_eigvals": Sample(aten.linalg_eigvals.default, [(F(3, 3),)], F32_64),
    "linalg_svdvals": Sample(aten.linalg_svdvals.default, [(F(3, 4),), (F(2, 4, 3),)], F32_64),
    "linalg_matrix_rank": Sample(aten.linalg_matrix_rank.atol_rtol_tensor, [(F(3, 4),), (F(2, 4, 4),)], F32_64),
    "linalg_pinv": Sample(aten.linalg_pinv.atol_rtol_tensor, [(F(3, 4),), (F(2, 4, 3),)], F32_64),
    "pinverse": Sample(aten.pinverse.default, [(F(3, 4),), (F(2, 4, 3),)], F32_64),
    "linalg_cond": Sample(aten.linalg_cond.default, [(F(3, 3),), (F(2, 4, 4), 1)], F32_64),
    "linalg_matrix_norm": Sample(aten.linalg_matrix_norm.str_ord, [(F(3, 4), "nuc"), (F(2, 3, 4), "fro", [-1, -2]),
                                                                   (aten.linalg_matrix_norm.default, F(3, 4), 1)],
                                 F32_64),
    "linalg_tensorinv": Sample(aten.linalg_tensorinv.default, [(F(2, 2, 4),), (F(2, 3, 6), 2)], F32_64),
    "linalg_tensorsolve": Sample(aten.linalg_tensorsolve.default, [(F(2, 3, 6), F(2, 3))], F32_64),
    "addbmm": Sample(aten.addbmm.default, [(F(3, 5), F(2, 3, 4), F(2, 4, 5)),
                                           C(F(5), F(2, 3, 4), F(2, 4, 5), beta=0.5, alpha=2)], F32_64),
})
