"""`xgbuild keygen`, `xgbuild sign`, `xgbuild verify`: keys, signatures and rebuild checks of engines.

    xgbuild keygen --out keys/ci                 keys/ci (private, 0600) and keys/ci.pub
    xgbuild sign ENGINE --key keys/ci [--out P]  add a signature (in place, by atomic rename)
    xgbuild verify ENGINE [--trusted-keys DIR] [--expect-digest HEX] [--rebuild [--dim N=S] [--entry F]]

`verify` exits 0 when every check asked for holds: the seal (always), a trusted signature (with
--trusted-keys or XG_TRUSTED_KEYS), the digest (--expect-digest), the rebuild's bytes (--rebuild);
1 when one fails, saying which; 2 for usage errors. The signing library is xgbuild/packager/signing.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from ..errors import XGError
from .common import EXIT_USAGE, emit_json, fail, parse_dims, settings_or_exit


def keygen(
    out: Path = typer.Option(..., "--out", metavar="PATH", help="the private key's path; the public key "
                             "goes to PATH.pub", show_default=False),
) -> None:
    """Make an Ed25519 signing key: PATH (private, mode 0600) and PATH.pub (OpenSSH public key)."""
    from ..packager.signing import generate_key, short_id
    try:
        private, public, keyid = generate_key(out)
    except XGError as exc:
        fail(str(exc))
    sys.stderr.write(f"wrote {private} (private: keep it secret) and {public}; key id {short_id(keyid)}\n"
                     f"trust it on deploy hosts by copying {public.name} into their trusted-keys directory\n")


def sign(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="an .xge engine file", show_default=False),
    key: Path = typer.Option(..., "--key", metavar="KEY", help="an Ed25519 private key (xgbuild keygen, or "
                             "an OpenSSH ed25519 key)", show_default=False),
    out: Optional[Path] = typer.Option(None, "--out", help="write the signed engine here (default: in place)"),
) -> None:
    """Sign an engine: add a signature over its provenance statement (made from its manifest if it
    has none). Its bundle bytes and digest do not change."""
    from ..build.provenance import sign_file
    from ..packager.signing import short_id
    settings = settings_or_exit()
    try:
        digest, keyid, made = sign_file(engine, key, settings, out)
    except XGError as exc:
        fail(str(exc))
    note = " (a statement made from its manifest: it was built without provenance)" if made else ""
    sys.stderr.write(f"signed {out or engine} ({digest[:12]}) with key {short_id(keyid)}{note}\n")


def signature_report(eng: Any, path: Path, trusted_keys: Path | None) -> list[dict]:
    """Each signature of a loaded engine: key id and status (valid / invalid / untrusted /
    unchecked), against `trusted_keys` or XG_TRUSTED_KEYS; a subject for another digest marks all
    of them `other-engine`."""
    from ..runtime.engine import Engine
    from ..settings import RunSettings
    envelope = eng.file.envelope
    if envelope is None:
        return []
    keys = trusted_keys or RunSettings.from_env().trusted_keys
    if keys is None:
        from ..packager.signing import check_signatures
        checks = check_signatures(envelope, None)
        matches = envelope.subject_digest() == eng.digest
    else:
        try:
            verdict = Engine.check_trust(eng, keys, f"engine {path}")
        except XGError as exc:
            fail(str(exc))
        checks, matches = verdict.checks, verdict.subject_matches
    return [{"keyid": c.keyid, "status": c.status if matches else "other-engine", "key": c.key_name}
            for c in checks]


def write_signatures(out: Any, eng: Any, signatures: list[dict]) -> None:
    """`inspect`'s lines for the trailer: each signature, then the provenance summary."""
    from ..packager.provenance import summary
    envelope = eng.file.envelope
    if envelope is None:
        out.write("signatures  none (unsigned, no provenance)\n")
        return
    if not signatures:
        out.write("signatures  none (a provenance statement, unsigned)\n")
    for s in signatures:
        out.write(f"signature   key {s['keyid'][:16]} {s['status']}" + (f" ({s['key']})" if s["key"] else "") + "\n")
    statement = envelope.statement()
    subject = statement["subject"][0]["digest"]["sha256"]
    if subject != eng.digest:
        out.write(f"provenance  for ANOTHER engine (digest {subject[:16]}…), not this one\n")
    for line in summary(statement):
        out.write(line + "\n")


def verify(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="an .xge engine file", show_default=False),
    trusted_keys: Optional[Path] = typer.Option(None, "--trusted-keys", metavar="DIR", help="require a signature "
                                                "by one of these .pub keys (default: XG_TRUSTED_KEYS)"),
    expect_digest: Optional[str] = typer.Option(None, "--expect-digest", metavar="HEX", help="require this "
                                                "bundle digest"),
    rebuild: bool = typer.Option(False, "--rebuild", help="rebuild from the engine's sources and recorded "
                                 "winners and compare bytes"),
    dim: list[str] = typer.Option([], "--dim", help="NAME=SIZE the kernels were tuned at (with --rebuild; "
                                  "default: the provenance's, else 1024)"),
    entry: Optional[str] = typer.Option(None, "--entry", help="the entry function (with --rebuild; default: "
                                        "the provenance's, else main)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="processes compiling kernels (with --rebuild)"),
    json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Check an engine: its seal, and as asked its signature, its digest, a rebuild's bytes."""
    from ..runtime.engine import Engine
    from ..settings import RunSettings
    if entry is not None and not entry.isidentifier():
        fail(f"--entry names a function, got {entry!r}", EXIT_USAGE)
    if expect_digest is not None:
        from ..packager.signing import normal_digest
        if normal_digest(expect_digest) is None:
            fail(f"--expect-digest takes a bundle digest (64 hex digits), got {expect_digest!r}", EXIT_USAGE)
    dims = parse_dims(dim) if dim else None
    keys = trusted_keys or RunSettings.from_env().trusted_keys
    try:
        eng = Engine.load(engine, trusted_keys=keys, expect_digest=expect_digest)
    except XGError as exc:
        fail(str(exc))
    result: dict = {"engine": str(engine), "digest": eng.digest, "sealed": True}
    lines = [f"engine {engine}: sealed, digest {eng.digest}"]
    if eng.trust is not None:
        from ..packager.signing import short_id
        result["signed_by"] = list(eng.trust.signers)
        lines.append("signed by trusted key " + ", ".join(short_id(k) for k in eng.trust.signers))
    if expect_digest is not None:
        result["digest_expected"] = True
        lines.append("digest as expected")
    if rebuild:
        from ..build.rebuild import rebuild as rebuild_engine
        settings = settings_or_exit()
        try:
            outcome = rebuild_engine(engine, settings, entry=entry, dims=dims, workers=jobs)
        except XGError as exc:
            fail(str(exc))
        result["rebuild"] = {"same": outcome.same, "rebuilt_digest": outcome.rebuilt_digest,
                             "differences": outcome.differences}
        if not outcome.same:
            if json_out:
                emit_json(result)
            fail(f"engine {engine} does not rebuild to the same bytes (rebuilt digest {outcome.rebuilt_digest}); "
                 f"{len(outcome.differences)} entries differ: " + "; ".join(outcome.differences[:8])
                 + (" …" if len(outcome.differences) > 8 else ""))
        lines.append("rebuilt from its sources and recorded winners: the same bytes")
    if json_out:
        emit_json(result)
    else:
        sys.stdout.write("\n".join(lines) + "\n")


def register(app: typer.Typer) -> None:
    app.command()(keygen)
    app.command()(sign)
    app.command()(verify)
