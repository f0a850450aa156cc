"""Signed plans: a detached Ed25519 signature over every member, so a team can require plans of its own.

    ssh-keygen -t ed25519 -N "" -C "team plans" -f plan-key        # plan-key (mode 600) and plan-key.pub
    opscope compile demo:gpt -b sim:npu-a1 -o gpt.opsplan --sign plan-key
    opscope run demo:gpt --plan gpt.opsplan --trust plan-key.pub   # or a folder of .pub files, or several --trust

Keys are OpenSSH ed25519 keys (what ssh-keygen makes; PEM/PKCS#8 Ed25519 keys are read too). plan.sig is
JSON: {"format": "opscope-plan-signature", "version": 1, "algorithm": "ed25519", "key_id": first 16 hex of
SHA-256 of the raw public key, "members": {name: SHA-256 hex of its bytes, for every other member},
"signature": base64 of the signature of `message(members)`}. A plan verifies when its members are exactly
the signed ones with the signed digests and a trusted key of that id signed them. plan.sha256 stays: it
catches accidents; anyone who edits a plan recomputes it, nobody without the private key can re-sign.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from pathlib import Path

from ..errors import UsageError, first_line

SIG_MEMBER = "plan.sig"
MAX_SIG = 1 << 20             # plan.sig: a digest per member, a few hundred members
MAX_KEY_FILE = 1 << 20        # a key file, or an authorized_keys-style list of public keys
MAX_TRUST_FILES = 1000


def key_id(public_key) -> str:
    from cryptography.hazmat.primitives import serialization as ser
    raw = public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def message(members: dict[str, str]) -> bytes:
    """What the key signs: one line per member, sorted (member names never hold a newline)."""
    return b"opscope-plan-signature-v1\n" + "".join(f"{d}  {n}\n" for n, d in sorted(members.items())).encode()


def digests(members: dict[str, bytes]) -> dict[str, str]:
    return {n: hashlib.sha256(b).hexdigest() for n, b in members.items() if n != SIG_MEMBER}


def sign(members: dict[str, bytes], key) -> bytes:
    """plan.sig's bytes for `members` (name -> bytes, every member but plan.sig) signed by `key`."""
    table = digests(members)
    return json.dumps({"format": "opscope-plan-signature", "version": 1, "algorithm": "ed25519",
                       "key_id": key_id(key.public_key()), "members": table,
                       "signature": base64.b64encode(key.sign(message(table))).decode()}, indent=1).encode()


def verify(members: dict[str, bytes], trusted: dict, where: str) -> str:
    """The key id that signed `members` (every member, plan.sig included); UsageError otherwise."""
    table, kid = signed_digests(members.get(SIG_MEMBER), trusted, where)
    check_digests(table, members, where, names=set(members))
    return kid


def signed_digests(signature: bytes | None, trusted: dict, where: str) -> tuple[dict, str]:
    """(member -> digest, key id) from plan.sig once a trusted key's signature of them verifies: the only
    thing read from a plan before its signature is checked."""
    from cryptography.exceptions import InvalidSignature
    if signature is None:
        raise UsageError(f"{where} is not signed: --trust runs only plans signed by a trusted key "
                         "(`opscope compile ... --sign KEY`)")
    try:
        doc = json.loads(signature)
        table, kid = doc["members"], doc["key_id"]
        raw = base64.b64decode(doc["signature"], validate=True)
        if doc.get("algorithm") != "ed25519" or not isinstance(table, dict) or not isinstance(kid, str) or \
                not all(isinstance(n, str) and isinstance(d, str) for n, d in table.items()):
            raise ValueError("not an Ed25519 signature of members")
    except (ValueError, TypeError, KeyError, RecursionError, binascii.Error) as e:
        raise UsageError(f"{where}: plan.sig is not a signature opscope reads ({type(e).__name__}: "
                         f"{first_line(e)[:60]}); sign the plan again") from None
    if kid not in trusted:
        shown = kid if kid.isalnum() and len(kid) <= 64 else ascii(kid)[:20]
        raise UsageError(f"{where} is signed by key {shown}, which --trust does not list "
                         f"(trusted: {', '.join(sorted(trusted))})")
    for public in trusted[kid]:
        try:
            public.verify(raw, message(table))
            return table, kid
        except InvalidSignature:
            pass
    raise UsageError(f"{where}: its signature does not verify with trusted key {kid}; get the plan again "
                     "from whoever signed it")


def check_digests(table: dict, members: dict[str, bytes], where: str, names: set) -> None:
    """The archive holds exactly the signed members (`names`), and each of `members` read so far has its
    signed digest."""
    unsigned = sorted(set(table) ^ (set(names) - {SIG_MEMBER}))
    changed = unsigned or sorted(n for n, d in digests(members).items() if table.get(n) != d)
    if changed:
        raise UsageError(f"{where}: changed since it was signed (member {ascii(changed[0])[:60]}); "
                         "get the plan again from whoever signed it")


def _read_key_file(path: Path, what: str) -> bytes:
    from .plan_archive import open_regular       # never blocks on a FIFO, refuses folders and devices
    with open_regular(path, f"{what} {path}", "pass an ssh-ed25519 key file") as f:
        data = f.read(MAX_KEY_FILE + 1)
    if len(data) > MAX_KEY_FILE:
        raise UsageError(f"{what} {path} is over {MAX_KEY_FILE} bytes: not a key file")
    return data


def load_signing_key(path):
    """The Ed25519 private key in `path` (OpenSSH or PEM), refused unless only its owner can read it."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    path = Path(path)
    data = _read_key_file(path, "--sign key")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise UsageError(f"--sign key {path} is readable by others (mode {mode:o}): `chmod 600 {path}`")
    try:
        key = ser.load_ssh_private_key(data, None) if b"OPENSSH PRIVATE KEY" in data else \
            ser.load_pem_private_key(data, None)
    except TypeError:
        raise UsageError(f"--sign key {path} is protected by a passphrase; opscope signs with an unencrypted "
                         "key (ssh-keygen -t ed25519 -N '' -f KEY)") from None
    except (ValueError, binascii.Error) as e:
        raise UsageError(f"--sign key {path} is not a private key opscope reads ({first_line(e)[:60]}); "
                         "make one with ssh-keygen -t ed25519 -N '' -f KEY") from None
    except Exception as e:                    # cryptography's own errors (e.g. unsupported algorithms)
        raise UsageError(f"--sign key {path} cannot be read ({type(e).__name__}: {first_line(e)[:60]})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"--sign key {path} is a {type(key).__name__}, not an Ed25519 key; make one with "
                         "ssh-keygen -t ed25519 -N '' -f KEY")
    return key


def load_trusted_keys(paths) -> dict:
    """key id -> [Ed25519 public keys] from files (OpenSSH .pub lines, authorized_keys-style lists, PEM)
    and folders (their *.pub files)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    keys: dict = {}
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.pub"))[:MAX_TRUST_FILES] if p.is_dir() else [p]
    for f in files:
        for where, public in _public_keys(f):
            if not isinstance(public, Ed25519PublicKey):
                raise UsageError(f"--trust {where}: a {type(public).__name__}, not an Ed25519 key")
            keys.setdefault(key_id(public), []).append(public)
    if not keys:
        raise UsageError(f"--trust {', '.join(map(str, paths))}: no public keys found (an ssh-ed25519 .pub file "
                         "or a folder of them)")
    return keys


def _public_keys(path: Path):
    from cryptography.hazmat.primitives import serialization as ser
    data = _read_key_file(path, "--trust key")
    if b"PRIVATE KEY" in data:
        raise UsageError(f"--trust {path} holds a private key: pass the public key ({path}.pub)")
    try:
        if b"-----BEGIN PUBLIC KEY-----" in data:
            yield str(path), ser.load_pem_public_key(data)
            return
        for i, line in enumerate(data.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith(b"#"):
                yield f"{path}:{i}", ser.load_ssh_public_key(line)
    except UsageError:
        raise
    except Exception as e:        # cryptography raises ValueError and its own UnsupportedAlgorithm
        raise UsageError(f"--trust {path}: not a public key opscope reads ({type(e).__name__}: "
                         f"{first_line(e)[:60]}); pass an ssh-ed25519 .pub file") from None


def generate_key(path) -> Path:
    """A new key pair: `path` (OpenSSH private key, mode 600) and `path`.pub -- as ssh-keygen -t ed25519 does."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    path = Path(path)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    Path(f"{path}.pub").write_bytes(public + b" opscope-plan-key\n")
    return path
