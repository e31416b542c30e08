"""Attacks on signed engines: forge what someone who can write the engine file would, then expect a
clear refusal from `xgrun --trusted-keys` / `--expect-digest` (exit 1, one line, no traceback) and
from the Python API (an EngineError), before anything in the engine runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

import xg
from xgbuild.errors import EngineError
from xgbuild.packager import frame
from xgbuild.packager.archive import bundle_bytes, read_bundle, write_bundle
from xgbuild.packager.manifest import canonical_json, sha256
from xgbuild.packager.signing import load_trusted_keys, parse_envelope

REPO = Path(__file__).resolve().parents[3]
SOURCE = """extern Tensor[float32, 4, 4] A
extern Tensor[float32, 4, 4] B
def main() -> Tensor[float32, 4, 4] {
    return (A @ B) * 0.5
}
"""
OTHER = SOURCE.replace("0.5", "2.0")


def cli(tool: str, *args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    # The host's own XG_TRUSTED_KEYS must not decide a test: only `env` may set it.
    inherited = {k: v for k, v in os.environ.items() if k != "XG_TRUSTED_KEYS"}
    full = {**inherited, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", f"xgbuild.cli.{tool}", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)


def refused(res: subprocess.CompletedProcess, *needles: str) -> str:
    err = res.stderr.strip()
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A builder's checkout with two keys and two engines (signed and unsigned), built by xgc."""
    root = tmp_path_factory.mktemp("builder")
    (root / "model.xg").write_text(SOURCE)
    (root / "other.xg").write_text(OTHER)
    env = {"XG_CACHE_DIR": str(root / "cache"), "XG_BUILDER_ID": "https://ci.example/xg-builder"}
    for name in ("ci", "mallory"):
        res = cli("xgbuild", "keygen", "--out", f"keys/{name}", cwd=root, env=env)
        assert res.returncode == 0, res.stderr
    for src, out, extra in (("model.xg", "signed.xge", ["--sign-key", "keys/ci"]), ("model.xg", "plain.xge", []),
                            ("other.xg", "other.xge", ["--sign-key", "keys/ci"])):
        res = cli("xgc", src, "--out", out, "--no-kernels", "--quiet", *extra, cwd=root, env=env)
        assert res.returncode == 0, res.stderr
    trusted = root / "trusted"
    trusted.mkdir()
    shutil.copy(root / "keys" / "ci.pub", trusted / "ci.pub")
    untrusted = root / "untrusted"
    untrusted.mkdir()
    shutil.copy(root / "keys" / "mallory.pub", untrusted / "mallory.pub")
    return root


@pytest.fixture
def deploy(world, tmp_path):
    """Another directory (another checkout, another cwd) with a copy of the trusted key."""
    keys = tmp_path / "deploy-keys"
    keys.mkdir()
    shutil.copy(world / "trusted" / "ci.pub", keys / "ci.pub")
    return tmp_path


def forge(path: Path, out: Path, edit, trailer: bytes | None | str = "keep") -> Path:
    """An attacker's engine: `path`'s entries edited by `edit`, the manifest's digests made to
    match, re-sealed by XG's own writer, with `path`'s trailer (or `trailer`) after it."""
    bundle = read_bundle(path)
    entries = dict(bundle.entries)
    edit(entries)
    manifest = json.loads(entries["manifest.json"])
    manifest["program"]["sha256"] = sha256(entries["program.json"])
    for src in manifest["sources"]:
        src["sha256"] = sha256(entries[src["path"]])
    entries["manifest.json"] = canonical_json(manifest)
    write_bundle(out, entries, trailer=bundle.trailer if trailer == "keep" else trailer)
    return out


def halve_to_quarter(entries: dict) -> None:
    program = entries["program.json"]
    assert program.count(b'["value",0.5]') == 1
    entries["program.json"] = program.replace(b'["value",0.5]', b'["value",0.2]')


# --- the happy path ----------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_signed_engine_runs_with_trusted_keys_from_another_checkout(world, deploy):
    engine = deploy / "engine.xge"
    shutil.copy(world / "signed.xge", engine)
    res = cli("xgrun", "engine.xge", "--trusted-keys", "deploy-keys", cwd=deploy)
    assert res.returncode == 0, res.stderr
    assert "checksum" in res.stdout
    # The settings default does the same.
    res = cli("xgrun", str(engine), cwd=REPO, env={"XG_TRUSTED_KEYS": str(deploy / "deploy-keys")})
    assert res.returncode == 0, res.stderr
    digest = xg.load_engine(engine).digest
    res = cli("xgrun", str(engine), "--expect-digest", digest, "--trusted-keys", str(deploy / "deploy-keys"))
    assert res.returncode == 0, res.stderr


def test_signing_keeps_the_bundle_bytes_and_digest(world, tmp_path):
    plain, signed = (world / "plain.xge").read_bytes(), (world / "signed.xge").read_bytes()
    assert signed.startswith(plain) and len(signed) > len(plain)       # the trailer only is added
    out = tmp_path / "later.xge"
    res = cli("xgbuild", "sign", str(world / "plain.xge"), "--key", str(world / "keys" / "ci"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert out.read_bytes().startswith(plain)
    assert (world / "plain.xge").read_bytes() == plain                  # --out: the input untouched
    assert xg.load_engine(out, trusted_keys=world / "trusted").trust.trusted
    if shutil.which("zstd"):        # decoders skip the seal and the trailer
        listing = subprocess.run(f"zstd -dc {out} | tar t", shell=True, capture_output=True, text=True)
        assert "manifest.json" in listing.stdout


# --- refusals ----------------------------------------------------------------------------------

def test_an_unsigned_engine_is_refused(world):
    err = refused(cli("xgrun", str(world / "plain.xge"), "--trusted-keys", str(world / "trusted")), "is not signed")
    assert load_trusted_keys(world / "trusted").listing().split()[0] in err      # names the trusted key ids
    with pytest.raises(EngineError, match="is not signed"):
        xg.load_engine(world / "plain.xge", trusted_keys=world / "trusted")


def test_an_engine_signed_by_an_untrusted_key_is_refused(world, tmp_path):
    engine = tmp_path / "m.xge"
    res = cli("xgbuild", "sign", str(world / "plain.xge"), "--key", str(world / "keys" / "mallory"), "--out",
              str(engine))
    assert res.returncode == 0, res.stderr
    mallory = next(iter(load_trusted_keys(world / "untrusted").keys))
    refused(cli("xgrun", str(engine), "--trusted-keys", str(world / "trusted")), "not among the trusted keys",
            mallory[:16])
    # and the builder's engine is refused by a host that trusts only mallory
    refused(cli("xgrun", str(world / "signed.xge"), "--trusted-keys", str(world / "untrusted")),
            "not among the trusted keys")


@pytest.mark.timeout(120)
def test_one_program_byte_changed_and_resealed_is_refused(world, tmp_path):
    forged = forge(world / "signed.xge", tmp_path / "forged.xge", halve_to_quarter)
    assert read_bundle(forged).digest != read_bundle(world / "signed.xge").digest    # a sound, sealed file
    err = refused(cli("xgrun", str(forged), "--trusted-keys", str(world / "trusted")), "another engine")
    digest = xg.load_engine(world / "signed.xge").digest
    err = refused(cli("xgrun", str(forged), "--expect-digest", digest), "not the expected", digest)
    assert xg.load_engine(forged).digest in err                              # both digests, whole
    # Re-signed by the attacker's own key: signed, but not by a trusted key.
    resigned = tmp_path / "resigned.xge"
    forge(world / "signed.xge", resigned, halve_to_quarter, trailer=None)
    assert cli("xgbuild", "sign", str(resigned), "--key", str(world / "keys" / "mallory")).returncode == 0
    refused(cli("xgrun", str(resigned), "--trusted-keys", str(world / "trusted")), "not among the trusted keys")


def test_a_signature_copied_from_another_engine_is_refused(world, tmp_path):
    other = read_bundle(world / "other.xge")
    target, digest = bundle_bytes(read_bundle(world / "plain.xge").entries)
    (tmp_path / "copied.xge").write_bytes(target + frame.trailer_frame(other.trailer))
    err = refused(cli("xgrun", str(tmp_path / "copied.xge"), "--trusted-keys", str(world / "trusted")),
                  "another engine")
    assert digest[:16] in err and other.digest[:16] in err


def test_a_signature_that_does_not_verify_is_refused(world, tmp_path):
    bundle = read_bundle(world / "signed.xge")
    envelope = json.loads(bundle.trailer)
    sig = bytearray(__import__("base64").b64decode(envelope["signatures"][0]["sig"]))
    sig[10] ^= 1
    envelope["signatures"][0]["sig"] = __import__("base64").b64encode(bytes(sig)).decode()
    forged = forge(world / "signed.xge", tmp_path / "badsig.xge", lambda e: None,
                   trailer=json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode())
    refused(cli("xgrun", str(forged), "--trusted-keys", str(world / "trusted")), "does not verify")
    # The statement edited (another builder claimed) under the old signature: same refusal.
    statement = json.loads(__import__("base64").b64decode(json.loads(bundle.trailer)["payload"]))
    statement["predicate"]["runDetails"]["builder"]["id"] = "https://evil.example"
    envelope = json.loads(bundle.trailer)
    envelope["payload"] = __import__("base64").b64encode(json.dumps(statement).encode()).decode()
    forged = forge(world / "signed.xge", tmp_path / "badstmt.xge", lambda e: None,
                   trailer=json.dumps(envelope).encode())
    refused(cli("xgrun", str(forged), "--trusted-keys", str(world / "trusted")), "does not verify")


def _trailers(signed: bytes, sealed: bytes, body: bytes):
    total = len(signed) - len(sealed)
    yield "cut in the trailer", signed[:-5]
    yield "cut at the trailer's start", signed[:len(sealed) + 3]
    yield "garbage after the seal", sealed + os.urandom(300)
    yield "garbage after the trailer", signed + b"\x00" * 40
    yield "declares 4 GiB", signed[:-8] + (2**32 - 1).to_bytes(4, "little") + frame.TRAILER_TAG
    yield "declares more than the file", signed[:-8] + (len(signed) + 10).to_bytes(4, "little") + frame.TRAILER_TAG
    yield "declares too little", signed[:-8] + (total - 3).to_bytes(4, "little") + frame.TRAILER_TAG
    yield "not JSON", sealed + frame.trailer_frame(b"\xff\xfe not json" * 10)
    yield "JSON nested deep", sealed + frame.trailer_frame(b"[" * 100_000 + b"]" * 100_000)
    yield "JSON of another shape", sealed + frame.trailer_frame(b'{"payload":1,"payloadType":2,"signatures":3}')
    yield "many signatures", sealed + frame.trailer_frame(json.dumps(
        {**json.loads(body), "signatures": json.loads(body)["signatures"] * 40}).encode())
    yield "a statement that is not in-toto", sealed + frame.trailer_frame(json.dumps(
        {**json.loads(body), "payload": __import__("base64").b64encode(b'{"_type":"x"}').decode()}).encode())


@pytest.mark.timeout(60)
def test_malformed_trailers_are_refused_cleanly(world, tmp_path):
    signed = (world / "signed.xge").read_bytes()
    sealed = (world / "plain.xge").read_bytes()
    body = read_bundle(world / "signed.xge").trailer
    for what, data in _trailers(signed, sealed, body):
        path = tmp_path / "t.xge"
        path.write_bytes(data)
        with pytest.raises(EngineError) as caught:
            xg.load_engine(path)                       # refused even with no trusted keys asked for
        message = str(caught.value)
        assert "\n" not in message and str(path) in message, (what, message)
    # and through the CLI, one of them: exit 1, one line
    path.write_bytes(signed[:-5])
    refused(cli("xgrun", str(path), "--trusted-keys", str(world / "trusted")))


def test_expect_digest_takes_a_digest(world):
    res = cli("xgrun", str(world / "signed.xge"), "--expect-digest", "abc")
    assert res.returncode == 2 and "64 hex digits" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(EngineError, match="64 hex digits"):
        xg.load_engine(world / "signed.xge", expect_digest="xyz")


def test_a_trust_root_that_trusts_nothing_is_an_error(world, tmp_path):
    (tmp_path / "empty").mkdir()
    refused(cli("xgrun", str(world / "signed.xge"), "--trusted-keys", str(tmp_path / "empty")), "no .pub")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.pub").write_text("not a key\n")
    refused(cli("xgrun", str(world / "signed.xge"), "--trusted-keys", str(tmp_path / "bad")), "x.pub")
    (tmp_path / "rsa").mkdir()
    rsa_pub = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    (tmp_path / "rsa" / "r.pub").write_bytes(rsa_pub.public_bytes(serialization.Encoding.OpenSSH,
                                                                  serialization.PublicFormat.OpenSSH))
    refused(cli("xgrun", str(world / "signed.xge"), "--trusted-keys", str(tmp_path / "rsa")), "not an Ed25519 key")


def test_openssh_keys_work_and_keygen_keeps_keys_private(world, tmp_path):
    assert (world / "keys" / "ci").stat().st_mode & 0o077 == 0
    res = cli("xgbuild", "keygen", "--out", str(world / "keys" / "ci"))
    assert res.returncode == 1 and "never overwrites" in res.stderr
    # An OpenSSH ed25519 key pair, as ssh-keygen writes it.
    key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "id_ed25519").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.OpenSSH,
                                                            serialization.NoEncryption()))
    (tmp_path / "ssh").mkdir()
    (tmp_path / "ssh" / "id_ed25519.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b" me@host\n")
    out = tmp_path / "ssh-signed.xge"
    res = cli("xgbuild", "sign", str(world / "plain.xge"), "--key", str(tmp_path / "id_ed25519"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    engine = xg.load_engine(out, trusted_keys=tmp_path / "ssh")
    assert engine.trust.trusted and engine.trust.signer == next(iter(load_trusted_keys(tmp_path / "ssh").keys))
    verdict = engine.check_trust(world / "trusted")
    assert not verdict.trusted and "not among the trusted keys" in verdict.problem


def test_inspect_and_verify_show_signatures(world):
    res = cli("xgbuild", "inspect", str(world / "signed.xge"), "--trusted-keys", str(world / "trusted"))
    assert res.returncode == 0, res.stderr
    assert "valid (ci.pub)" in res.stdout and "https://ci.example/xg-builder" in res.stdout
    res = cli("xgbuild", "inspect", str(world / "signed.xge"), "--trusted-keys", str(world / "untrusted"))
    assert "untrusted" in res.stdout
    res = cli("xgbuild", "inspect", str(world / "plain.xge"))
    assert "unsigned" in res.stdout
    import json
    info = json.loads(cli("xgbuild", "inspect", str(world / "signed.xge"), "--json",
                          "--trusted-keys", str(world / "trusted")).stdout)
    assert {"determinism", "signatures", "provenance"} <= set(info)     # a signed engine keeps every part
    res = cli("xgbuild", "verify", str(world / "signed.xge"), "--trusted-keys", str(world / "trusted"))
    assert res.returncode == 0 and "signed by trusted key" in res.stdout, res.stderr
    refused(cli("xgbuild", "verify", str(world / "plain.xge"), "--trusted-keys", str(world / "trusted")),
            "is not signed")


def test_parse_envelope_never_crashes_on_garbage():
    import random
    rng = random.Random(0)
    for n in range(300):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        with pytest.raises(Exception) as caught:
            parse_envelope(junk, "engine x")
        assert type(caught.value).__name__ == "SigningError", caught.value
