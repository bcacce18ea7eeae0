"""The closed world of a sealed run: the seal lists every file of the run directory, and what is
written after the seal is a sealed link of its own.

A run directory's files, and the rule for each:

=====================================  ==========================================================
file                                   rule
=====================================  ==========================================================
``NN_<phase>.json``, ``.ipynb``,       written by the phases and the runner before the seal:
``NN/...``, ``approvals/<fp>.json``,   listed in the seal (``manifest.json`` ``seal.files``) with
``approvals/pending-*.json``,          their sha256. A plan still waiting (``pending-*``) at the
``route.json``, ``receipt.json``,      seal is part of what the run ended with.
``params.yaml``
``manifest.json``, ``_SUCCESS``        the seal itself; ``_SUCCESS`` lists the manifest's sha256
``resolution.json``                    ``runbook resolve`` after a HOLD's seal: a link
``cleanup.json``, the teardown         ``runbook cleanup`` after the seal: a link (before the
approvals ``runbook cleanup`` writes   seal, as after Ctrl-C, they are sealed like the rest)
``links/NNNN-<kind>.json``             the links: each names the sha256 of the manifest (the
                                       first) or of the link before it, and the files it adds;
                                       a link of each kind may add only its writer's files and
                                       replace none of the seal's but its own record, and no link
                                       removes a file (:data:`LINK_KINDS`)
an interactive phase's notebook        kept in ``notebooks/`` of the project, never in the run
                                       directory; one copied in after the seal is an addition
the HTML report                        written beside the run (``reports/<run_id>.html``), never
                                       into it: ``runbook report`` refuses a path inside it
anything else                          an addition, reported by ``runbook verify`` as altered
=====================================  ==========================================================

A manifest without ``seal`` was written before the closed world (a legacy seal): verify checks
the files it lists, as it did then, and says it is legacy.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib._time import utc_now
from runbook_lib.errors import EvidenceError, UsageError
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.layout import COMPLETION_MARKER, KEPT_PARAMS, MANIFEST

SEAL_VERSION = 2
"""``seal.version`` of a closed-world seal (the first closed one; legacy seals have no ``seal``)."""
LINKS_DIR = "links"
"""Sealed links, one file per write after the seal: ``links/0001-resolution.json``."""
UNSEALED = frozenset({MANIFEST, COMPLETION_MARKER})
"""Files of the seal itself, which cannot list their own hashes."""
BUNDLE = "attestation.intoto.jsonl"
"""The run's in-toto attestation bundle (:mod:`runbook_lib.evidence.attestation`): a Test Result
statement per phase and a Simple Verification Result for the decision; it names sealed files'
sha256, so it is not one of them."""
ATTESTATION = "attestation.dsse.json"
"""The one signed statement of runs sealed before :data:`BUNDLE` (:func:`runbook_lib.evidence.signing.statement`)."""
ATTESTATIONS = frozenset({BUNDLE, ATTESTATION})
"""The attestation files a run may hold, outside the seal they attest."""


LINK_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "resolution": (("resolution.json", "resolution.dsse.json"), ()),
    "cleanup": (("cleanup.json", "approvals/*.json"), ("cleanup.json",)),
}
"""What a link of each kind may hold: kind -> (the files its writer writes, as ``fnmatch``
patterns; the sealed files it may replace). ``runbook resolve`` writes the resolution and its
signature once; ``runbook cleanup`` writes ``cleanup.json`` (again on each cleanup, and over the
one an interrupted run sealed) and the teardown approvals it applied. Anything else in a link
(another file, a sealed file replaced, a file removed) is not what either writer does: the link
is broken and its files count as additions."""


def run_files(run_dir: Path) -> list[str]:
    """Every file under ``run_dir`` (relative POSIX paths, sorted), symlinks included as files:
    what a reader of the directory would see."""
    out = []
    for p in run_dir.rglob("*"):
        if p.is_symlink() or p.is_file():
            out.append(p.relative_to(run_dir).as_posix())
    return sorted(out)


def symlinks_in(run_dir: Path) -> list[str]:
    """The symlinks at ``run_dir`` itself (``"."``) and anywhere under it (relative POSIX paths,
    sorted). A run directory holds only what the run wrote: a symlink in it would make the next
    write land wherever it points."""
    if run_dir.is_symlink():
        return ["."]
    if not run_dir.is_dir():
        return []
    return sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_symlink())


def refuse_symlinks(run_dir: Path) -> None:
    """Stop before writing into ``run_dir`` when it is, or holds, a symlink: a write would follow
    it out of the run (:func:`symlinks_in`). Phases, ``runbook resolve`` and ``runbook cleanup``
    call it first.

    Raises:
        UsageError: naming the symlinks.
    """
    links = symlinks_in(run_dir)
    if links:
        raise UsageError(f"{run_dir} {'is a symlink' if links == ['.'] else 'holds symlinks: ' + ', '.join(links[:5])}; "
                         "a run directory holds only the files its run wrote, and a write would follow a link out of "
                         "it. Remove them (or name the real directory) and run again")


def seal_listing(run_dir: Path) -> dict[str, Any]:
    """The ``seal`` section of a manifest being written now: every file of the run but the seal's
    own (:data:`UNSEALED`, :data:`ATTESTATIONS`), each by sha256.

    Raises:
        EvidenceError: a symlink in the run directory (a sealed file must be the file itself).
    """
    files: dict[str, str] = {}
    for rel in run_files(run_dir):
        if rel in UNSEALED or rel in ATTESTATIONS:
            continue
        p = run_dir / rel
        if p.is_symlink():
            raise EvidenceError(f"{rel} in {run_dir} is a symlink (to {p.readlink()}); a seal hashes files, not "
                                "links: replace it with the file, or remove it, and seal again")
        files[rel] = sha256_file(p)
    return {"version": SEAL_VERSION, "files": files}


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, unreadable, not JSON or not an object."""
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return body if isinstance(body, dict) else None


def seal_of(run_dir: Path) -> dict[str, Any] | None:
    """The manifest's ``seal`` section; None for a legacy seal or no (readable) manifest."""
    m = read_json_object(run_dir / MANIFEST)
    seal = (m or {}).get("seal")
    return seal if isinstance(seal, dict) and isinstance(seal.get("files"), dict) else None


def is_sealed(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a manifest (closed or legacy)."""
    return (run_dir / MANIFEST).is_file()


@dataclass(frozen=True)
class Link:
    """A write after the seal, as read back.

    Attributes:
        path: ``links/NNNN-<kind>.json`` relative to the run directory.
        kind: ``resolution``, ``cleanup``, ...
        body: the link's JSON (``prev_sha256``, ``files``, ``removed``, ``at``, ``by``).
        sha256: sha256 of its bytes (the next link names it).
    """

    path: str
    kind: str
    body: dict[str, Any]
    sha256: str


def _chained_links(run_dir: Path, seal: dict[str, Any]) -> list[Path]:
    """Link files not listed in the seal (those are sealed files of an earlier chain), in order."""
    return sorted(p for p in (run_dir / LINKS_DIR).glob("*.json")
                  if f"{LINKS_DIR}/{p.name}" not in seal["files"] and p.is_file())


def read_links(run_dir: Path) -> list[Link]:
    """The links written after this run's seal, in order (empty for a legacy or no seal)."""
    seal = seal_of(run_dir)
    if seal is None:
        return []
    out = []
    for p in _chained_links(run_dir, seal):
        body = read_json_object(p) or {}
        out.append(Link(f"{LINKS_DIR}/{p.name}", str(body.get("kind", "?")), body, sha256_file(p)))
    return out


def append_link(run_dir: Path, kind: str, files: list[str], *, by: str = "") -> Link | None:
    """Seal ``files`` (written after the run's seal, relative to ``run_dir``) as a link of their
    own: ``links/NNNN-<kind>.json`` naming the sha256 of the manifest (the first link) or of the
    link before it, and each file's sha256. ``kind`` and ``files`` must be what
    :data:`LINK_KINDS` allows (verify holds every link to it).

    Returns:
        The link written; None when the run has no closed-world seal (not sealed yet: the seal
        will list the files; or a legacy seal, checked open-world).

    Raises:
        EvidenceError: a listed file is missing.
        ValueError: ``kind`` or a file is not what :data:`LINK_KINDS` allows (a bug of the caller).
    """
    seal = seal_of(run_dir)
    if seal is None:
        return None
    links = read_links(run_dir)
    wrong = link_problem(kind, {rel: "" for rel in files}, [], _checked(run_dir, seal, links)[0])
    if wrong:
        raise ValueError(f"a {kind} link cannot hold {files}: {wrong}")
    prev = links[-1].sha256 if links else sha256_file(run_dir / MANIFEST)
    hashed = {}
    for rel in files:
        p = run_dir / rel
        if not p.is_file():
            raise EvidenceError(f"a {kind} link lists {rel}, which is not a file in {run_dir}")
        hashed[rel] = sha256_file(p)
    name = f"{LINKS_DIR}/{len(_chained_links(run_dir, seal)) + 1:04d}-{kind}.json"
    body = {"kind": kind, "prev_sha256": prev, "files": hashed, "removed": [], "at": utc_now(), "by": by}
    digest = write_json_atomic(run_dir / name, body)
    return Link(name, kind, body, digest)


def expected_files(run_dir: Path) -> dict[str, str] | None:
    """What the closed world holds now: the seal's files, then each valid link's files in order
    (:func:`link_problem`); None for a legacy seal."""
    seal = seal_of(run_dir)
    if seal is None:
        return None
    return _checked(run_dir, seal, read_links(run_dir))[0]


def link_problem(kind: str, files: dict[str, Any], removed: list[Any], sealed: dict[str, str]) -> str:
    """Why a link of ``kind`` adding ``files`` (relative path -> sha256) and removing ``removed``
    is not what its writer does, given the files ``sealed`` before it (:data:`LINK_KINDS`); ""
    when it is."""
    if kind not in LINK_KINDS:
        return f"its kind {kind!r} is none a runbook command writes ({', '.join(LINK_KINDS)})"
    writes, replaces = LINK_KINDS[kind]
    if removed:
        return f"it removes {', '.join(map(str, removed))}: no command removes a sealed file"
    foreign = [rel for rel in files if not any(fnmatch.fnmatchcase(rel, pat) for pat in writes)]
    if foreign:
        return f"it adds {', '.join(foreign)}, which a {kind} link never holds (only {', '.join(writes)})"
    replaced = [rel for rel in files if rel in sealed and rel not in replaces]
    if replaced:
        return f"it replaces the sealed {', '.join(replaced)}: a {kind} link adds files, it does not rewrite them"
    return ""


def _checked(run_dir: Path, seal: dict[str, Any], links: list[Link]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The closed world's files (the seal's, each valid link's added in order) and one row per
    link: ``intact``, or ``broken-link`` when it names another sha256 than the manifest's (first
    link) or the link before it, or holds what :func:`link_problem` refuses (its files are then
    not part of the closed world)."""
    files = {str(k): str(v) for k, v in seal["files"].items()}
    rows: list[dict[str, str]] = []
    prev = sha256_file(run_dir / MANIFEST)
    for link in links:
        body_files, body_removed = link.body.get("files"), link.body.get("removed", [])
        added: dict[str, Any] = body_files if isinstance(body_files, dict) else {}
        removed: list[Any] = body_removed if isinstance(body_removed, list) else [body_removed]
        problem = ("it names a sha256 that is not the manifest's (first link) or the link before it"
                   if link.body.get("prev_sha256") != prev else link_problem(link.kind, added, removed, files))
        rows.append({"path": link.path, "status": "broken-link" if problem else "intact",
                     "by": f"{link.kind} link after the seal" if not problem else f"{link.kind} link: {problem}"})
        if not problem:
            files.update({str(k): str(v) for k, v in added.items()})
        prev = link.sha256
    return files, rows


def closed_world_rows(run_dir: Path) -> list[dict[str, str]]:
    """Rows (``path``, ``status``, ``by``) for the closed world, as :func:`runbook_lib.audit.verify.verify_run`
    reports them: each link's place in the chain and whether it holds what its kind may
    (:func:`_checked`), every sealed or validly linked file (``intact``, ``altered``, ``missing``),
    and every other file (``altered``: an addition is an alteration). No rows for a legacy seal.
    """
    seal = seal_of(run_dir)
    if seal is None:
        return []
    links = read_links(run_dir)
    expected, rows = _checked(run_dir, seal, links)
    for rel, want in sorted(expected.items()):
        p = run_dir / rel
        status = ("missing" if not (p.is_file() or p.is_symlink()) else
                  "altered" if p.is_symlink() or sha256_file(p) != want else "intact")
        rows.append({"path": rel, "status": status, "by": "the seal (closed world)"})
    linked = {link.path for link in links}
    for rel in run_files(run_dir):
        if rel in expected or rel in UNSEALED or rel in linked or rel in ATTESTATIONS:
            continue
        rows.append({"path": rel, "status": "altered",
                     "by": "not in the seal or any valid link: added after the seal (an addition is an alteration)"})
    return rows


def sealed_notebooks(run_dir: Path) -> list[Path]:
    """The executed phase notebooks the seal covers, in phase order: those its closed world lists
    (or, for a legacy seal, its manifest's ``outputs.notebooks``); none for an unsealed run."""
    m = read_json_object(run_dir / MANIFEST)
    if m is None:
        return []
    expected = expected_files(run_dir)
    names = set(expected) if expected is not None else set((m.get("outputs") or {}).get("notebooks") or {})
    return sorted(run_dir / n for n in names if "/" not in n and n.endswith(".ipynb") and n[:2].isdigit())


def looks_like_run_dir(path: Path) -> bool:
    """True when ``path`` is a directory a run wrote: it holds the kept params, a manifest or a
    phase record (``NN_<phase>.json``). ``/etc`` is not one."""
    if not path.is_dir():
        return False
    return (path / KEPT_PARAMS).is_file() or (path / MANIFEST).is_file() or any(path.glob("0[1-6]_*.json"))


def seal_kind(run_dir: Path) -> str:
    """``closed`` (a closed-world seal), ``legacy`` (a manifest without one: checked open-world,
    as when it was written) or ``none`` (no manifest: not a sealed run)."""
    if not is_sealed(run_dir):
        return "none"
    return "closed" if seal_of(run_dir) is not None else "legacy"
