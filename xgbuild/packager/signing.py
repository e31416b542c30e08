"""Signed engines: Ed25519 keys, the DSSE envelope in an engine's trailer, and the trust verdict.

An engine's trailer (`frame.py`) holds one DSSE envelope (github.com/secure-systems-lab/dsse) as
canonical JSON:

    {"payload": base64(in-toto Statement), "payloadType": "application/vnd.in-toto+json",
     "signatures": [{"keyid": sha256 hex of the raw public key, "sig": base64(Ed25519 signature)}]}

Each signature is over DSSE's pre-authentication encoding of the payload type and payload, so a
signature can be moved neither to another payload nor to another payload type. The payload's
`subject` names the bundle digest: a signature over one engine's statement never vouches for
another engine, whatever file it is copied into. Verifying needs the public keys only, no network.

Keys: a private key is PEM (PKCS#8) or OpenSSH, unencrypted, Ed25519; a public key is OpenSSH
(`ssh-ed25519 AAAA... comment`, what `xgbuild keygen` writes) or PEM. A trusted-keys directory
holds `*.pub` files; a key's id is the sha256 of its 32 raw bytes, shown as its first 16 digits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import XGError

# `cryptography` loads when a key is read or a signature made or checked: a deploy host reading an
# engine without a trust root never needs it.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
MAX_SIGNATURES = 16
MAX_KEY_FILE = 64 * 1024
MAX_TRUSTED_KEYS = 1024
_HEX = frozenset("0123456789abcdef")


class SigningError(XGError):
    """A key cannot be read or written, or a trailer is not a well-formed signature envelope."""


class TrustError(XGError):
    """An engine is not trusted: unsigned, signed by no trusted key, a bad signature, or another
    digest than the one expected."""


# --- keys --------------------------------------------------------------------------------------

def key_id(public: Ed25519PublicKey) -> str:
    """The key's id: sha256 hex of its 32 raw bytes."""
    from cryptography.hazmat.primitives import serialization
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def short_id(keyid: str) -> str:
    return keyid[:16]


def _read_key_file(path: Path, what: str) -> bytes:
    # O_NONBLOCK: a FIFO named as a key is refused below instead of blocking the open.
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SigningError(f"{what} {path} cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SigningError(f"{what} {path} is not a regular file")
        if info.st_size > MAX_KEY_FILE:
            raise SigningError(f"{what} {path} is {info.st_size} bytes; a key file is at most {MAX_KEY_FILE}")
        with open(fd, "rb", closefd=False) as fh:
            return fh.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise SigningError(f"{what} {path} cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def load_private_key(path: Path | str) -> Ed25519PrivateKey:
    """The Ed25519 private key in `path` (PEM PKCS#8 or OpenSSH, unencrypted)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    path = Path(path)
    data = _read_key_file(path, "signing key")
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY"):
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningError(f"signing key {path} is encrypted; XG reads unencrypted keys "
                           "(keep them readable by the signer only)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise SigningError(f"signing key {path} is not a PEM or OpenSSH private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"signing key {path} is a {type(key).__name__.removeprefix('_')}, not an Ed25519 key; "
                           "make one with `xgbuild keygen`")
    return key


def parse_public_key(data: bytes, where: str) -> Ed25519PublicKey:
    """An Ed25519 public key from OpenSSH (`ssh-ed25519 AAAA...`) or PEM text."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    text = data.strip()
    try:
        if text.startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(text)
        else:
            key = serialization.load_pem_public_key(text)
    except (ValueError, UnsupportedAlgorithm):
        raise SigningError(f"{where} is not an OpenSSH or PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError(f"{where} is not an Ed25519 key; XG signs with Ed25519 only")
    return key


def load_public_key(path: Path | str) -> Ed25519PublicKey:
    path = Path(path)
    return parse_public_key(_read_key_file(path, "public key"), f"public key {path}")


@dataclass(frozen=True)
class TrustedKeys:
    """The keys a deploy host trusts: key id -> (key, the file it came from)."""
    source: str
    keys: dict

    def name(self, keyid: str) -> str:
        return Path(self.keys[keyid][1]).name if keyid in self.keys else "?"

    def listing(self) -> str:
        return ", ".join(f"{short_id(k)} ({self.name(k)})" for k in sorted(self.keys))


def load_trusted_keys(path: Path | str) -> TrustedKeys:
    """The `*.pub` keys of a directory (or one `.pub` file). An empty directory or a file that is
    not a public key is an error: a trust root that silently trusts nothing hides a mistake."""
    path = Path(path)
    try:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.name.endswith(".pub"))
        elif path.is_file():
            files = [path]
        else:
            raise SigningError(f"trusted keys {path} is not a directory of .pub files")
    except OSError as exc:
        raise SigningError(f"trusted keys {path} cannot be read ({exc.strerror or exc})") from None
    if not files:
        raise SigningError(f"trusted keys {path} holds no .pub public keys")
    if len(files) > MAX_TRUSTED_KEYS:
        raise SigningError(f"trusted keys {path} holds {len(files)} keys; at most {MAX_TRUSTED_KEYS}")
    keys = {}
    for file in files:
        key = load_public_key(file)
        keys[key_id(key)] = (key, str(file))
    return TrustedKeys(str(path), keys)


def generate_key(out: Path | str) -> tuple[Path, Path, str]:
    """Write a new Ed25519 key: `out` (private, PEM PKCS#8, mode 0600) and `out.pub` (OpenSSH).
    Neither may exist already. (private path, public path, key id)."""
    out = Path(out)
    pub_path = out.with_name(out.name + ".pub")
    for p in (out, pub_path):
        if p.exists() or p.is_symlink():
            raise SigningError(f"{p} exists already; keygen never overwrites a key")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL and the mode at creation: the private key is never readable by others, not even
        # for the moment between a create and a chmod.
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with open(fd, "wb") as fh:
            fh.write(private)
        fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with open(fd, "wb") as fh:
            fh.write(public + f" xg:{out.name}\n".encode())
    except OSError as exc:
        raise SigningError(f"cannot write key {out}: {exc.strerror or exc}") from None
    return out, pub_path, key_id(key.public_key())


# --- the envelope ------------------------------------------------------------------------------

def canonical(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what a signature signs."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@dataclass(frozen=True)
class Envelope:
    payload: bytes                               # the statement's canonical JSON
    signatures: tuple[tuple[str, bytes], ...]    # (key id, Ed25519 signature)

    def statement(self) -> dict:
        return json.loads(self.payload)

    def subject_digest(self) -> str:
        return self.statement()["subject"][0]["digest"]["sha256"]

    def to_bytes(self) -> bytes:
        return canonical({"payload": base64.b64encode(self.payload).decode("ascii"), "payloadType": PAYLOAD_TYPE,
                          "signatures": [{"keyid": k, "sig": base64.b64encode(s).decode("ascii")}
                                         for k, s in self.signatures]})

    def signed(self, key: Ed25519PrivateKey) -> "Envelope":
        """This envelope with `key`'s signature added (replacing an earlier one by the same key)."""
        keyid = key_id(key.public_key())
        sig = key.sign(pae(PAYLOAD_TYPE, self.payload))
        others = tuple((k, s) for k, s in self.signatures if k != keyid)
        if len(others) >= MAX_SIGNATURES:
            raise SigningError(f"an engine carries at most {MAX_SIGNATURES} signatures")
        return Envelope(self.payload, tuple(sorted(others + ((keyid, sig),))))


def new_envelope(statement: dict) -> Envelope:
    return Envelope(canonical(statement), ())


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what} is not base64") from None


def _check_statement(payload: bytes) -> None:
    statement = json.loads(payload.decode("utf-8"))
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise ValueError(f"its payload is not an in-toto Statement ({STATEMENT_TYPE})")
    subject = statement.get("subject")
    if not (isinstance(subject, list) and len(subject) == 1 and isinstance(subject[0], dict)
            and isinstance(subject[0].get("digest"), dict)):
        raise ValueError("its statement does not have exactly one subject with a digest")
    sha = subject[0]["digest"].get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= _HEX):
        raise ValueError("its statement's subject digest is not 64 lowercase hex digits")
    if not isinstance(statement.get("predicate"), dict) or not isinstance(statement.get("predicateType"), str):
        raise ValueError("its statement has no predicate")


def parse_envelope(body: bytes, where: str) -> Envelope:
    """The envelope in a trailer body; a SigningError naming `where` unless it is well formed.
    Signatures are not checked here (that needs the trusted keys): only their form."""
    try:
        document = json.loads(body.decode("ascii"))
        if not isinstance(document, dict) or set(document) != {"payload", "payloadType", "signatures"}:
            raise ValueError("it does not hold exactly 'payload', 'payloadType' and 'signatures'")
        if document["payloadType"] != PAYLOAD_TYPE:
            raise ValueError(f"its payload type is not {PAYLOAD_TYPE}")
        payload = _b64(document["payload"], "its payload")
        signatures = document["signatures"]
        if not isinstance(signatures, list) or len(signatures) > MAX_SIGNATURES:
            raise ValueError(f"'signatures' is not a list of at most {MAX_SIGNATURES}")
        sigs = []
        for entry in signatures:
            if not isinstance(entry, dict) or set(entry) != {"keyid", "sig"}:
                raise ValueError("a signature does not hold exactly 'keyid' and 'sig'")
            keyid = entry["keyid"]
            if not (isinstance(keyid, str) and len(keyid) == 64 and set(keyid) <= _HEX):
                raise ValueError("a signature's key id is not 64 lowercase hex digits")
            sig = _b64(entry["sig"], "a signature")
            if len(sig) != 64:
                raise ValueError("a signature is not 64 bytes (Ed25519)")
            sigs.append((keyid, sig))
        _check_statement(payload)
    except (UnicodeDecodeError, RecursionError):
        raise SigningError(f"{where} has a signature trailer that is not ASCII JSON") from None
    except ValueError as exc:
        reason = str(exc) if not isinstance(exc, json.JSONDecodeError) else "it is not JSON"
        raise SigningError(f"{where} has a malformed signature trailer: {reason}") from None
    return Envelope(payload, tuple(sigs))


# --- the verdict -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SignatureCheck:
    keyid: str
    status: str          # valid | invalid | untrusted (no trusted key has its id) | unchecked (no keys given)
    key_name: str = ""


@dataclass(frozen=True)
class Trust:
    """Whether an engine is trusted, and why (one line, `problem`) when it is not."""
    trusted: bool
    signers: tuple[str, ...]          # key ids of the trusted keys whose signatures hold
    problem: str | None
    checks: tuple[SignatureCheck, ...] = ()
    subject_matches: bool = True

    @property
    def signer(self) -> str | None:
        return self.signers[0] if self.signers else None


def _distinct(a: str, b: str) -> tuple[str, str]:
    """Prefixes of two hex digests long enough to differ (whole when equal)."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    n = max(16, n + 4)
    return (a[:n] + ("…" if n < len(a) else ""), b[:n] + ("…" if n < len(b) else ""))


def check_signatures(envelope: Envelope, trusted: TrustedKeys | None) -> tuple[SignatureCheck, ...]:
    from cryptography.exceptions import InvalidSignature
    checks = []
    for keyid, sig in envelope.signatures:
        if trusted is None:
            checks.append(SignatureCheck(keyid, "unchecked"))
            continue
        if keyid not in trusted.keys:
            checks.append(SignatureCheck(keyid, "untrusted"))
            continue
        key, _ = trusted.keys[keyid]
        try:
            key.verify(sig, pae(PAYLOAD_TYPE, envelope.payload))
            status = "valid"
        except InvalidSignature:
            status = "invalid"
        checks.append(SignatureCheck(keyid, status, trusted.name(keyid)))
    return tuple(checks)


def trust_verdict(envelope: Envelope | None, digest: str, trusted: TrustedKeys, where: str) -> Trust:
    """Whether the engine of bundle digest `digest`, carrying `envelope`, is signed by a key in
    `trusted`: its statement names this digest and at least one trusted key's signature holds."""
    if envelope is None:
        return Trust(False, (), f"{where} is not signed; the trusted keys ({trusted.listing()}) require a "
                                f"signature: sign it with `xgbuild sign {where.removeprefix('engine ')} --key KEY`")
    checks = check_signatures(envelope, trusted)
    subject = envelope.subject_digest()
    if subject != digest:
        mine, theirs = _distinct(digest, subject)
        return Trust(False, (), f"{where} carries a signature for another engine: the signed statement names "
                                f"digest {theirs}, this engine has {mine} (its contents were changed after "
                                "signing, or the signature was copied from another engine)", checks, False)
    valid = tuple(c.keyid for c in checks if c.status == "valid")
    if valid:
        return Trust(True, valid, None, checks)
    if not checks:
        return Trust(False, (), f"{where} carries a provenance statement but no signature; the trusted keys "
                                f"({trusted.listing()}) require one", checks)
    invalid = [c for c in checks if c.status == "invalid"]
    if invalid:
        names = ", ".join(f"{short_id(c.keyid)} ({c.key_name})" for c in invalid)
        return Trust(False, (), f"{where} has a signature by trusted key {names} that does not verify: the "
                                "engine's statement or signature was changed after signing", checks)
    ids = ", ".join(short_id(c.keyid) for c in checks)
    return Trust(False, (), f"{where} is signed by key {ids}, which is not among the trusted keys "
                            f"({trusted.listing()})", checks)


def normal_digest(text: str) -> str | None:
    """`--expect-digest`'s value as 64 lowercase hex digits (an optional `sha256:` prefix
    allowed), or None when it is not a digest."""
    value = text.strip().lower().removeprefix("sha256:")
    return value if len(value) == 64 and set(value) <= _HEX else None


def digest_problem(digest: str, expected: str, where: str) -> str | None:
    """Why an engine of `digest` is not the one `expected`, or None when it is."""
    if digest == expected:
        return None
    return f"{where} has digest {digest}, not the expected {expected}"
