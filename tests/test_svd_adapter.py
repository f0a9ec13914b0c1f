"""SVD (AntiPaSTO-style) adapter: exact round trip at delta_S = 0, the disk cache, what trains."""

import copy

import pytest
import torch

from rhlab.adapters.svd import SVDLinear, svd_cached, svd_modules, wrap_svd

torch.set_num_threads(1)  # the test machine is shared; 1 thread avoids oversubscription stalls


@pytest.fixture
def tiny(builtin):
    model, tok = builtin
    return copy.deepcopy(model), tok


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("rank", [None, 16])
def test_round_trip_at_zero_delta_matches_the_model(tiny, tmp_path, rank):
    model, tok = tiny
    ids = torch.tensor([tok("mia felt sad. then tom came to help and they played a game.")["input_ids"]])
    before = logits(model, ids)
    info = wrap_svd(model, "builtin:tiny-stories", rank=rank, cache_dir=tmp_path)
    mods = svd_modules(model)
    assert len(mods) == len(info["modules"]) == 28  # 7 linears x 4 layers, lm_head untouched
    assert all((m.W_res is not None) == (rank is not None and rank < min(m.in_features, m.out_features))
               for m in mods.values())
    assert (logits(model, ids) - before).abs().max() < 1e-3


def test_only_delta_s_trains_and_checkpoints_hold_only_delta_s(tiny, tmp_path):
    model, _ = tiny
    n_state = len(model.state_dict())
    wrap_svd(model, "builtin:tiny-stories", cache_dir=tmp_path)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(".delta_S") for n in trainable)
    assert sum(p.numel() for n, p in model.named_parameters() if p.requires_grad) == 4 * (128 * 5 + 64 * 2)
    # the frozen basis is not persisted: 28 weights out, 28 delta_S in
    assert len(model.state_dict()) == n_state


def test_svd_cache_hit_and_fingerprint(tiny, tmp_path):
    model, _ = tiny
    other = copy.deepcopy(model)
    first = wrap_svd(model, "builtin:tiny-stories", cache_dir=tmp_path)
    assert first["cache_hits"] == 0 and len(list((tmp_path).rglob("*.safetensors"))) == 28
    again = wrap_svd(copy.deepcopy(other), "builtin:tiny-stories", cache_dir=tmp_path)
    assert again["cache_hits"] == 28 and again["cache_dir"] == first["cache_dir"]
    with torch.no_grad():  # different weights -> different cache key, never a stale SVD
        other.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
    changed = wrap_svd(other, "builtin:tiny-stories", cache_dir=tmp_path)
    assert changed["cache_hits"] == 0 and changed["cache_dir"] != first["cache_dir"]


def test_cached_svd_equals_fresh(tmp_path):
    W = torch.randn(12, 7)
    U, S, Vh, hit = svd_cached(W, tmp_path / "w.safetensors")
    U2, S2, Vh2, hit2 = svd_cached(W, tmp_path / "w.safetensors")
    assert not hit and hit2
    assert torch.equal(U, U2) and torch.equal(S, S2) and torch.equal(Vh, Vh2)
    assert torch.allclose((U * S) @ Vh, W, atol=1e-5)


def test_delta_s_gradient_is_the_rank_space_formula():
    """dL/d delta_S = sum_t (x_t Vh^T) * (dL/dy_t U): what projection and extraction read."""
    torch.manual_seed(0)
    W, b = torch.randn(6, 9), torch.randn(6)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    m = SVDLinear(U, S, Vh, b)
    x = torch.randn(4, 9)
    y = m(x)
    assert torch.allclose(y, x @ W.T + b, atol=1e-5)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    assert torch.allclose(m.delta_S.grad, ((x @ Vh.T) * (dy @ U)).sum(0), atol=1e-5)


def test_cayley_rotation_is_identity_at_zero_orthogonal_and_trains():
    torch.manual_seed(0)
    W, b = torch.randn(6, 10), torch.randn(6)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)  # rank 6: two blocks of 3
    m = SVDLinear(U, S, Vh, b, rotation=3, max_angle=0.5)
    x = torch.randn(5, 10)
    assert torch.allclose(m(x), x @ W.T + b, atol=1e-5)  # rot_T = 0: R = I
    assert m.rot_T.shape == (2, 3) and m.rot_T.requires_grad
    with torch.no_grad():
        m.rot_T.normal_(0, 2.0)
    R = m.rotation()
    assert torch.allclose(R @ R.transpose(-1, -2), torch.eye(3).expand(2, 3, 3), atol=1e-5)
    assert torch.allclose(torch.linalg.det(R), torch.ones(2), atol=1e-5)  # a rotation, not a reflection
    angles = torch.linalg.eigvals(R).angle().abs()  # bounded: tanh squashes A to |a| < 2 tan(max_angle / 2)
    assert float(angles.max()) < 1.0 + 1e-5
    # the forward is ((x (R Vh)^T) * S) U^T + b with R block-diagonal
    full = torch.block_diag(*R)
    assert torch.allclose(m(x), ((x @ (full @ Vh).T) * S) @ U.T + b, atol=1e-5)
    m(x).pow(2).sum().backward()
    assert m.rot_T.grad.abs().sum() > 0 and m.delta_S.grad.abs().sum() > 0
    with pytest.raises(AssertionError, match="must be >= 2 and divide rank 6"):
        SVDLinear(U, S, Vh, b, rotation=4)


def test_rotating_wrap_keeps_the_model_and_trains_rot_t(tiny, tmp_path):
    model, tok = tiny
    ids = torch.tensor([tok("mia felt sad. then tom came to help.")["input_ids"]])
    before = logits(model, ids)
    wrap_svd(model, "builtin:tiny-stories", cache_dir=tmp_path, rotation=4)
    assert (logits(model, ids) - before).abs().max() < 1e-3
    trainable = {n.rsplit(".", 1)[1] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"delta_S", "rot_T"}
