"""Signed plans (issue 24): `compile --sign KEY` adds plan.sig; `run --plan --trust KEYS` runs a plan signed
by a trusted key and refuses, in one line, one that is unsigned, signed by another key, or changed at all."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile

import pytest

from opscope.runtime import models
from opscope.runtime.errors import UsageError
from opscope.runtime.passes.plan_file import compile_to_file, load_plan, open_plan_session
from opscope.runtime.passes.plan_sign import generate_key, load_signing_key, load_trusted_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return generate_key(folder / "team"), generate_key(folder / "other")


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys):
    path = tmp_path_factory.mktemp("signed") / "mlp.opsplan"
    info = compile_to_file(path, "demo:mlp", "numpy", passes="all", train=True, sign=keys[0])
    assert info["signed_by"]
    return path


def _members(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _write(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _load(path, trust_paths):
    model, inputs = models.load_train("demo:mlp")
    return load_plan(path, model=model, inputs=inputs, trust=load_trusted_keys(trust_paths))


def test_a_plan_signed_by_a_trusted_key_runs(signed, keys):
    loaded = _load(signed, [f"{keys[0]}.pub"])
    model, inputs = models.load_train("demo:mlp")
    assert loaded.executor.run(*inputs)
    assert _load(signed, [keys[0].parent]).plan          # a folder of .pub files trusts each of them
    assert "plan.sig" in _members(signed)


def test_signed_by_another_key_or_unsigned_is_refused(signed, keys, tmp_path):
    with pytest.raises(UsageError, match=r"is signed by key [0-9a-f]{16}, which --trust does not list"):
        _load(signed, [f"{keys[1]}.pub"])
    members = _members(signed)
    del members["plan.sig"]
    with pytest.raises(UsageError, match="is not signed: --trust runs only plans signed by a trusted key"):
        _load(_write(tmp_path / "unsigned.opsplan", members), [f"{keys[0]}.pub"])


def _changed(members, name):
    """One byte of `name` changed; plan.json's checksum recomputed, as anyone editing a plan would."""
    out = dict(members)
    data = bytearray(out[name])
    data[len(data) // 2] ^= 0x01
    out[name] = bytes(data)
    if name == "plan.json":
        out["plan.sha256"] = hashlib.sha256(out[name]).hexdigest().encode()
    return out


def test_any_byte_changed_in_any_member_is_refused(signed, keys, tmp_path):
    members = _members(signed)
    names = [n for n in members if n != "plan.sig"]
    assert any(n.startswith("constants/") for n in names)
    for name in names:
        bad = _write(tmp_path / "bad.opsplan", _changed(members, name))
        with pytest.raises(UsageError) as e:
            _load(bad, [f"{keys[0]}.pub"])
        assert "\n" not in str(e.value)
        assert "changed since it was signed" in str(e.value), (name, str(e.value))
    # a member dropped, or the signature itself changed
    fewer = {n: b for n, b in members.items() if not n.startswith("constants/")}
    with pytest.raises(UsageError):
        _load(_write(tmp_path / "fewer.opsplan", fewer), [f"{keys[0]}.pub"])
    sig = json.loads(members["plan.sig"])
    raw = bytearray(__import__("base64").b64decode(sig["signature"]))
    raw[0] ^= 1
    sig["signature"] = __import__("base64").b64encode(bytes(raw)).decode()
    with pytest.raises(UsageError, match="signature does not verify"):
        _load(_write(tmp_path / "sig.opsplan", {**members, "plan.sig": json.dumps(sig).encode()}),
              [f"{keys[0]}.pub"])


def test_an_attacker_re_signing_with_their_own_key_under_our_key_id_is_refused(signed, keys, tmp_path):
    """plan.sig names the key id of a trusted key but is made with another key."""
    from opscope.runtime.passes import plan_sign
    members = _changed(_members(signed), "plan.json")
    del members["plan.sig"]
    forged = json.loads(plan_sign.sign(members, load_signing_key(keys[1])))
    forged["key_id"] = plan_sign.key_id(load_signing_key(keys[0]).public_key())
    with pytest.raises(UsageError, match="signature does not verify"):
        _load(_write(tmp_path / "forged.opsplan", {**members, "plan.sig": json.dumps(forged).encode()}),
              [f"{keys[0]}.pub"])


def test_key_files_are_checked(keys, tmp_path):
    loose = tmp_path / "loose"
    shutil.copy(keys[0], loose)
    os.chmod(loose, 0o644)
    with pytest.raises(UsageError, match=r"readable by others \(mode 644\): `chmod 600"):
        load_signing_key(loose)
    with pytest.raises(UsageError, match="holds a private key: pass the public key"):
        load_trusted_keys([keys[0]])
    (tmp_path / "junk.pub").write_text("ssh-ed25519 not-base64 x\n")
    with pytest.raises(UsageError, match="not a public key opscope reads"):
        load_trusted_keys([tmp_path / "junk.pub"])
    with pytest.raises(UsageError, match="does not exist"):
        load_trusted_keys([tmp_path / "missing.pub"])
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    locked = tmp_path / "locked"
    locked.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.BestAvailableEncryption(b"pw")))
    os.chmod(locked, 0o600)
    with pytest.raises(UsageError, match="protected by a passphrase"):
        load_signing_key(locked)


def test_recompile_cannot_be_combined_with_trust(signed, keys):
    with pytest.raises(UsageError, match="--recompile rewrites the plan unsigned"):
        open_plan_session(signed, "demo:mlp", recompile=True, trust=load_trusted_keys([f"{keys[0]}.pub"]))


@pytest.mark.multiprocess
@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")
def test_cli_sign_with_an_ssh_keygen_key_and_trust_its_pub(cli, tmp_path):
    """What a team does: ssh-keygen once, compile --sign, hand the plan around, run --trust."""
    for name in ("team", "other"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", tmp_path / name],
                       check=True, timeout=30)
    plan = tmp_path / "mlp.opsplan"
    r = cli("compile", "demo:mlp", "-b", "numpy", "-o", plan, "--sign", tmp_path / "team", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signed_by"]
    r = cli("run", "demo:mlp", "--plan", plan, "--trust", f"{tmp_path / 'team'}.pub", "--json")
    assert r.returncode == 0, r.stderr
    r = cli("run", "demo:mlp", "--plan", plan, "--trust", f"{tmp_path / 'other'}.pub")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--trust does not list" in r.stderr
