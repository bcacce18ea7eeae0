"""Checkpoint portability: inspect a checkpoint without running it, then load it safely.

:func:`inspect` reads a checkpoint (one file, or a directory of shards) and reports, per file, its
format, size, sha256, every global a pickle-based file would import (listed from a static
disassembly: torch's own :func:`torch.serialization.get_unsafe_globals_in_checkpoint` for the zip
format, the standard library's :mod:`pickletools` for the legacy format), and, when nothing
unsafe is named, what a ``weights_only`` load finds: tensor names, shapes, dtypes, the devices
the tensors were saved on, wrapper key prefixes and tied (storage-sharing) tensors. Each
problem is a :class:`Finding` with what was seen, why it matters and what to do.

:func:`load_state` is the only way this project loads a checkpoint it did not just write:
``torch.load(weights_only=True)`` with an explicit ``map_location`` (the remap is recorded), an
operator allowlist of globals honoured only when the file's sha256 matches the frozen manifest,
wrapper prefixes stripped only when every key has the prefix and every shape matches the
reference, and tied tensors checked to stay tied. An unrestricted (non-weights_only) load never runs.

Sources: torch.load and weights_only, https://pytorch.org/docs/stable/generated/torch.load.html
(the default became ``True`` in PyTorch 2.6, https://pytorch.org/docs/stable/notes/serialization.html);
the safetensors format (8-byte little-endian header length, a JSON header with each tensor's
``dtype``, ``shape`` and ``data_offsets``), https://huggingface.co/docs/safetensors/index; the
sharded checkpoint index (``*.index.json`` with a ``weight_map`` from tensor name to shard file),
https://huggingface.co/docs/transformers/main/en/big_models; the wrapper prefixes ``module.``
(torch.nn.DataParallel / DistributedDataParallel) and ``_orig_mod.`` (torch.compile),
https://pytorch.org/docs/stable/notes/serialization.html.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import pickle
import pickletools
import re
import struct
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from runbook_lib.errors import WorkloadError

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP; torch.compile
SEVERITIES = ("info", "risk", "blocker")
INDEX_SUFFIX = ".index.json"
_CHUNK = 1 << 20


class CheckpointError(WorkloadError):
    """A checkpoint cannot be loaded safely or completely; the message names the file, what was
    seen and what to do."""


@dataclass(frozen=True)
class Finding:
    """One thing :func:`inspect` or :func:`load_state` found.

    Attributes:
        check: a stable code (``unsafe_global``, ``legacy_format``, ``device_tags``,
            ``wrapper_prefix``, ``partial_prefix``, ``tied_weights``, ``truncated``,
            ``missing_shard``, ``unknown_format``, ``unreadable``, ``non_tensor_items``,
            ``allowed_global``).
        severity: ``info`` (recorded), ``risk`` (works, but a person should know) or ``blocker``
            (the checkpoint cannot be loaded safely or completely).
        file: the file, relative to the checkpoint's root ("" for the whole set).
        seen: what was seen. reason: why it matters. fix: what to do next.
    """

    check: str
    severity: str
    file: str
    seen: str
    reason: str
    fix: str


@dataclass(frozen=True)
class FileReport:
    """One file of a checkpoint.

    Attributes:
        file: path relative to the checkpoint's root. format: ``torch-zip``, ``torch-legacy``,
            ``safetensors``, ``shard-index``, ``dcp-metadata``, ``dcp-shard``, ``metadata`` (JSON, YAML, text:
            hashed, never loaded) or ``unknown``. bytes: file size. sha256: hex digest.
        globals: every global the pickle imports (``module.name``), from a static disassembly.
        unsafe_globals: those outside torch's ``weights_only`` allowlist.
        devices: device tags the tensors were saved on (``cpu``, ``cuda:1``).
        tensors: ``{name: {"shape": [...], "dtype": "float32"}}``; empty when not loaded.
        tensor_bytes: bytes of tensor data (tied tensors counted once).
        tied: groups of tensor names sharing one storage.
    """

    file: str
    format: str
    bytes: int
    sha256: str
    globals: tuple[str, ...] = ()
    unsafe_globals: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    tensor_bytes: int = 0
    tied: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Inspection:
    """What :func:`inspect` found in a checkpoint: one :class:`FileReport` per file and the
    findings. ``root``: the checkpoint path as given."""

    root: str
    files: tuple[FileReport, ...]
    findings: tuple[Finding, ...]

    @property
    def total_bytes(self) -> int:
        """Bytes of every file: what a restore downloads."""
        return sum(f.bytes for f in self.files)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "blocker"]

    def rows(self) -> list[dict[str, Any]]:
        """One row per file, for a notebook table."""
        return [{"file": f.file, "format": f.format, "MiB": round(f.bytes / 2**20, 3), "sha256": f.sha256[:16],
                 "tensors": len(f.tensors), "devices": ", ".join(f.devices), "globals": len(f.globals),
                 "unsafe globals": ", ".join(f.unsafe_globals), "tied groups": len(f.tied)} for f in self.files]

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "total_bytes": self.total_bytes,
                "files": [asdict(f) for f in self.files], "findings": [asdict(f) for f in self.findings]}


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders embedded numbers by value: ``step-9`` before ``step-10`` (file-name
    order would put ``step-10`` first)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def pickle_globals(data: bytes | IO[bytes], *, pickles: int = 1) -> list[str]:
    """Every global (``module.name``) the first ``pickles`` pickles in ``data`` would import, by
    disassembly with :func:`pickletools.genops` (nothing is executed). ``STACK_GLOBAL``
    (protocol 4 and later) takes the two strings pushed before it, directly or from the memo.

    Raises:
        ValueError: the bytes are not a complete pickle (truncated or not a pickle).
    """
    f = io.BytesIO(data) if isinstance(data, bytes) else data
    found: list[str] = []
    for _ in range(pickles):
        memo: dict[int, Any] = {}
        recent: list[Any] = []
        for op, arg, _pos in pickletools.genops(f):
            name = op.name
            if name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", ".", 1))
            elif name == "STACK_GLOBAL":
                if len(recent) >= 2 and all(isinstance(v, str) for v in recent[-2:]):
                    found.append(f"{recent[-2]}.{recent[-1]}")
                else:
                    found.append("<unresolved STACK_GLOBAL>")
            elif "UNICODE" in name or name in ("STRING", "BINSTRING", "SHORT_BINSTRING"):
                recent.append(arg)
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                recent.append(memo.get(int(arg or 0)))
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg or 0)] = recent[-1] if recent else None
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            else:
                recent.append(None)
    return list(dict.fromkeys(found))


def _tensor_table(state: Any, problems: list[tuple[str, str]] | None = None,
                  ) -> tuple[dict[str, dict[str, Any]], int, tuple[tuple[str, ...], ...]]:
    """Names, shapes and dtypes of the tensors in a (possibly nested) state dict, nested keys
    joined with ``.``; bytes with each storage counted once; groups of names sharing a storage
    (tied weights). ``problems`` collects ``(check, seen)``: ``ambiguous_names`` (two tensors
    whose joined names are equal, as ``{"a.b": x, "a": {"b": y}}``) and ``unsupported_layout``
    (a sparse or quantized tensor, which this runbook neither digests nor compares)."""
    import torch

    table: dict[str, dict[str, Any]] = {}
    by_storage: dict[tuple[int, int], list[str]] = {}
    sizes: dict[tuple[int, int], int] = {}
    found = problems if problems is not None else []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            if prefix in table:
                found.append(("ambiguous_names", f"two tensors are both named {prefix!r}"))
            table[prefix] = {"shape": list(obj.shape), "dtype": str(obj.dtype).removeprefix("torch.")}
            if obj.layout != torch.strided or obj.is_quantized:
                found.append(("unsupported_layout", f"{prefix!r} is {obj.layout} {obj.dtype}"
                              .replace("torch.", "")))
                return
            st = obj.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            by_storage.setdefault(key, []).append(prefix)
            sizes[key] = st.nbytes()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}.{i}" if prefix else str(i), v)

    walk("", state)
    tied = tuple(tuple(names) for key, names in by_storage.items() if len(names) > 1 and key[1] > 0)
    return table, sum(sizes.values()), tied


def _safe_load(path: Path, *, map_location: Any, mmap: bool) -> Any:
    import torch

    return torch.load(path, weights_only=True, map_location=map_location, mmap=mmap)


def _inspect_torch(path: Path, rel: str, zipped: bool, findings: list[Finding],
                   allow_globals: Sequence[str] = ()) -> FileReport:
    import torch

    base: dict[str, Any] = {"file": rel, "format": "torch-zip" if zipped else "torch-legacy", "bytes": path.stat().st_size,
            "sha256": sha256_of(path)}
    try:
        if zipped:
            with zipfile.ZipFile(path) as z:
                pkl = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
                if pkl is None:
                    raise ValueError("no data.pkl in the archive (a TorchScript archive or not a torch.save file)")
                every = pickle_globals(z.read(pkl))
            unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        else:
            with path.open("rb") as f:  # magic number, protocol, system info, then the object
                every = pickle_globals(f, pickles=4)
            unsafe = []
    except (ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        findings.append(Finding("unreadable", "blocker", rel, f"{type(exc).__name__}: {exc}",
                                 "the file cannot be disassembled: it is truncated, corrupt or not a torch.save file",
                                 "copy it again from the source and compare its sha256 with the source's"))
        return FileReport(**base)
    if not zipped:
        findings.append(Finding(
            "legacy_format", "risk", rel, "torch legacy (non-zip) serialization",
            "torch's static checker reads only the zip format, so the unsafe globals of this file are found by a "
            "weights_only load, which refuses any global outside its allowlist before running it",
            "re-save it with torch.save (zip format, the default since PyTorch 1.6) on the source"))
    if unsafe:
        findings.append(_unsafe(rel, unsafe, allowed=set(unsafe) <= set(allow_globals)))
        return FileReport(**base, globals=tuple(every), unsafe_globals=tuple(unsafe))
    locations: list[str] = []

    def note(storage: Any, loc: str) -> Any:
        locations.append(loc)
        return storage

    try:
        state = _safe_load(path, map_location=note, mmap=zipped)
    except pickle.UnpicklingError as exc:
        refused = _refused_global(str(exc))
        findings.append(_unsafe(rel, [refused] if refused else ["<named in the refusal>"], detail=str(exc)[:300],
                                allowed=bool(refused) and refused in allow_globals))
        return FileReport(**base, globals=tuple(every), unsafe_globals=(refused,) if refused else ())
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        findings.append(Finding("truncated", "blocker", rel, f"{type(exc).__name__}: {str(exc)[:200]}",
                                 "the file's tensors cannot be read to their end", "copy it again from the source and "
                                 "compare its sha256 with the frozen manifest"))
        return FileReport(**base, globals=tuple(every))
    problems: list[tuple[str, str]] = []
    tensors, nbytes, tied = _tensor_table(state, problems)
    for check, seen in problems:
        findings.append(Finding(
            check, "blocker", rel, seen,
            "two tensors would share one name in the tensor table, so one would hide the other in the comparison"
            if check == "ambiguous_names" else
            "a sparse or quantized tensor is neither digested nor compared by this runbook, so its parity cannot "
            "be proved", "rename one of the keys on the source" if check == "ambiguous_names" else
            "save it dense (to_dense()) or dequantized (dequantize()) on the source, with the scheme recorded "
            "beside it"))
    devices = tuple(sorted(set(locations)))
    _key_findings(rel, list(tensors), findings)
    if any(d != "cpu" for d in devices):
        findings.append(Finding(
            "device_tags", "info", rel, f"tensors saved on {', '.join(devices)}",
            "torch.load restores each tensor to the device it was saved on unless map_location says otherwise; a "
            "device the target lacks (another GPU index, no GPU) fails the load",
            "load_state remaps every tag to the profile's device explicitly and records the remap"))
    if tied:
        findings.append(Finding(
            "tied_weights", "info", rel, "; ".join(" = ".join(g) for g in tied),
            "these tensors share one storage (tied weights); a conversion that copies them separately unties them "
            "and doubles their memory", "load_state checks they are still tied after any conversion"))
    return FileReport(**base, globals=tuple(every), devices=devices, tensors=tensors, tensor_bytes=nbytes, tied=tied)


def _refused_global(message: str) -> str:
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message) or re.search(r"GLOBAL ([\w.]+)", message)
    return m.group(1) if m else ""


def _refusal(message: str) -> str:
    """What torch's weights_only unpickler refused, for a person: the global it names, or (a reduce
    of an unlisted function, a class it cannot build) its own reason, one line of at most 300
    characters (the text after ``WeightsUnpickler error:`` in torch/_weights_only_unpickler.py's
    message)."""
    name = _refused_global(message)
    if name:
        return name
    built = re.search(r"but got <class '([\w.]+)'>", message)
    if built:  # e.g. numpy.dtypes.Int64DType: made by an allowlisted global, never named in the pickle
        return (f"torch must also build {built.group(1)}, which the file's pickle does not name (an allowlisted "
                f"global makes it); list {built.group(1)} in workload.allow_globals too")
    reason = re.search(r"WeightsUnpickler error:\s*([^\n]+)", message)
    return "torch: " + (reason.group(1) if reason else message).strip()[:300]


def _unsafe(rel: str, names: Sequence[str], detail: str = "", *, allowed: bool = False) -> Finding:
    if allowed:
        return Finding(
            "allowed_global", "risk", rel, "imports " + ", ".join(names) + ", each listed in workload.allow_globals",
            "the operator trusts these names; loading imports them, so code in their modules runs",
            "load_state honours the allowlist only for a file whose sha256 matches the frozen manifest; re-save the "
            "file with tensors only to drop the allowlist")
    return Finding(
        "unsafe_global", "blocker", rel, "imports " + ", ".join(names) + (f" ({detail})" if detail else ""),
        "loading a pickle that names a global outside torch's weights_only allowlist can run any code its author "
        "chose; it is never loaded without weights_only",
        "re-save the state dict with tensors only on the source, or, if you trust exactly these names, list them in "
        "workload.allow_globals: they are honoured only for a file whose sha256 matches the frozen manifest")


def _key_findings(rel: str, keys: list[str], findings: list[Finding]) -> None:
    for prefix in WRAPPER_PREFIXES:
        having = [k for k in keys if k.startswith(prefix)]
        if having and len(having) == len(keys):
            findings.append(Finding(
                "wrapper_prefix", "info", rel, f"every key starts with {prefix!r}",
                "a checkpoint saved from a DataParallel/DistributedDataParallel or torch.compile wrapper carries its "
                "prefix; an unwrapped model does not expect it",
                "the runbook compares the keys as saved; an entry point that loads an unwrapped model strictly strips "
                "it first with runbook_lib.portability.checkpoint.strip_wrapper_prefix(weights, model.state_dict()) (the example "
                "entry point does), which strips it only when every stripped key and shape matches the model's"))
        elif having:
            findings.append(Finding(
                "partial_prefix", "blocker", rel, f"{len(having)} of {len(keys)} keys start with {prefix!r}, e.g. "
                f"{having[0]!r} and {next(k for k in keys if not k.startswith(prefix))!r}",
                "a prefix on some keys only is not a wrapper's: stripping it could map two tensors to one name",
                "re-save the state dict from the unwrapped model on the source"))


def _inspect_safetensors(path: Path, rel: str, findings: list[Finding]) -> FileReport:
    size = path.stat().st_size
    base: dict[str, Any] = {"file": rel, "format": "safetensors", "bytes": size, "sha256": sha256_of(path)}
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header of {n} bytes in a file of {size} bytes")
            header = json.loads(f.read(n))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        findings.append(Finding("truncated", "blocker", rel, f"unreadable safetensors header: {exc}",
                                 "the file ends before its header does", "copy it again from the source"))
        return FileReport(**base)
    header.pop("__metadata__", None)
    end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    tensors = {k: {"shape": list(v["shape"]), "dtype": str(v["dtype"]).lower()} for k, v in header.items()}
    if 8 + n + end > size:
        findings.append(Finding("truncated", "blocker", rel, f"{size} bytes; its header needs {8 + n + end}",
                                 "the file ends before its last tensor's data", "copy it again from the source and "
                                 "compare its sha256 with the source's"))
    _key_findings(rel, list(tensors), findings)
    return FileReport(**base, tensors=tensors, tensor_bytes=end)


DCP_METADATA = ".metadata"
"""The metadata file of a torch distributed-checkpoint (DCP) directory, next to its ``.distcp``
shards (https://pytorch.org/docs/stable/distributed.checkpoint.html)."""

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_NAMES = frozenset({"torch.Size", "torch.serialization._get_layout", "pathlib.PosixPath", "pathlib.PurePosixPath",
                        "pathlib.WindowsPath", "pathlib.PureWindowsPath", "collections.OrderedDict",
                        "builtins.set", "builtins.frozenset", "builtins.slice"})


def dcp_global_allowed(name: str) -> bool:
    """Whether a DCP ``.metadata`` pickle may import ``name`` (``module.attr``): the metadata
    dataclasses of ``torch.distributed.checkpoint``, torch dtypes, ``torch.Size``, the layout
    helper, paths and plain containers. torch reads that file with an unrestricted
    ``pickle.load``; this project reads it only through :func:`read_dcp_metadata`, which refuses
    any other global (the restricting-globals pattern of
    https://docs.python.org/3/library/pickle.html#restricting-globals)."""
    import torch

    module, _, attr = name.rpartition(".")
    if name in _DCP_NAMES or module in _DCP_MODULES:
        return True
    return module == "torch" and isinstance(getattr(torch, attr, None), torch.dtype)


def read_dcp_metadata(root: Path) -> Any:
    """The :class:`torch.distributed.checkpoint.metadata.Metadata` of the DCP directory ``root``,
    unpickled with every global checked by :func:`dcp_global_allowed` first.

    Raises:
        CheckpointError: the file names another global (nothing of it ran), or is not a pickle.
    """
    class _Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if not dcp_global_allowed(f"{module}.{name}"):
                raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")
            return super().find_class(module, name)

    path = root / DCP_METADATA
    try:
        with path.open("rb") as f:
            return _Restricted(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: the DCP metadata cannot be read safely ({exc}); re-save the checkpoint with "
                              "torch.distributed.checkpoint.save on the source") from exc


def load_dcp(root: Path, *, device: str = "cpu") -> dict[str, Any]:
    """Every tensor of the DCP directory ``root`` (``{fqn: tensor}`` on ``device``), read through
    :func:`read_dcp_metadata` and torch's own shard reader, which loads tensor payloads with
    ``weights_only=True``. Non-tensor items (stored as pickled bytes, which torch's planner would
    load without ``weights_only``) are never requested.

    Raises:
        CheckpointError: the metadata is unsafe or a shard cannot be read.
    """
    import warnings

    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    metadata = read_dcp_metadata(root)

    class _Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            md = read_dcp_metadata(Path(self.path))
            if getattr(md, "storage_meta", None) is not None:
                md.storage_meta.load_id = self.load_id
            return md

    state = {fqn: torch.empty(tuple(md.size), dtype=md.properties.dtype)
             for fqn, md in metadata.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)}
    try:
        with warnings.catch_warnings():  # one process, no process group: DCP warns that it assumes so
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load(state, storage_reader=_Reader(str(root)), no_dist=True)
    except (RuntimeError, OSError, AssertionError, ValueError) as exc:
        raise CheckpointError(f"{root}: a DCP shard cannot be read ({type(exc).__name__}: {str(exc)[:200]}); copy "
                              "the directory again from the source") from exc
    return {k: v.to(device) for k, v in state.items()}


def _inspect_dcp(root: Path, findings: list[Finding]) -> list[FileReport]:
    """The DCP directory ``root``: its metadata's globals, tensors (names, shapes, dtypes from
    the metadata, nothing loaded) and every shard the metadata names (missing or short)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = root / DCP_METADATA
    every = pickle_globals(meta.read_bytes())
    unsafe = [n for n in every if not dcp_global_allowed(n)]
    report: dict[str, Any] = {"file": DCP_METADATA, "format": "dcp-metadata", "bytes": meta.stat().st_size,
              "sha256": sha256_of(meta),
              "globals": tuple(every), "unsafe_globals": tuple(unsafe)}
    if unsafe:
        findings.append(_unsafe(DCP_METADATA, unsafe))
        return [FileReport(**report)]
    md = read_dcp_metadata(root)
    tensors = {fqn: {"shape": list(m.size), "dtype": str(m.properties.dtype).removeprefix("torch.")}
               for fqn, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    other = sorted(fqn for fqn, m in md.state_dict_metadata.items() if not isinstance(m, TensorStorageMetadata))
    if other:
        findings.append(Finding("non_tensor_items", "risk", DCP_METADATA, f"{len(other)} items stored as pickled "
                                f"objects, e.g. {other[0]!r}", "torch's DCP planner loads such items without "
                                "weights_only, so they are copied and hashed but never loaded here",
                                "keep only tensors in the state dict you save, or accept that these items are not "
                                "compared"))
    _key_findings(DCP_METADATA, list(tensors), findings)
    reports = [FileReport(**report, tensors=tensors,
                          tensor_bytes=sum(int(s.length) for s in md.storage_data.values()))]
    need: dict[str, int] = {}
    for info in md.storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), int(info.offset) + int(info.length))
    for rel, end in sorted(need.items(), key=lambda kv: natural_key(kv[0])):
        shard = root / rel
        if not shard.is_file():
            findings.append(Finding("missing_shard", "blocker", rel, f"named by {DCP_METADATA}; not in {root}",
                                    "a sharded checkpoint loads only whole",
                                    "copy the missing shard from the source and freeze the set again"))
        elif shard.stat().st_size < end:
            findings.append(Finding("truncated", "blocker", rel, f"{shard.stat().st_size} bytes; the metadata needs "
                                    f"{end}", "the shard ends before its last tensor's data",
                                    "copy it again from the source and compare its sha256 with the source's"))
    return reports


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: natural_key(p.relative_to(root).as_posix()))


RESERVED_NAMES = ("MANIFEST.json", "_SUCCESS")
"""Top-level names a set in the run's store keeps for itself (``MANIFEST_KEY`` and
``MARKER_KEY`` in runbook_lib/storage/base.py): a checkpoint file with one of them is a blocker."""


def inspect(path: str | Path, *, allow_globals: Sequence[str] = ()) -> Inspection:
    """Inspect the checkpoint at ``path`` (a file or a directory of shards) without running it:
    see the module docstring. A shard index (``*.index.json``) whose ``weight_map`` names a file
    that is not there is a ``missing_shard`` blocker. A torch distributed-checkpoint directory
    (``.metadata`` and ``.distcp`` shards) is inspected from its metadata, read only through
    :func:`read_dcp_metadata` (globals checked first): tensor names, shapes and dtypes, shards
    missing or shorter than the metadata says, items stored as pickled objects. A file whose unsafe globals are all in
    ``allow_globals`` is an ``allowed_global`` risk instead of an ``unsafe_global`` blocker (its
    tensors are not listed: it is loaded only once frozen, by :func:`load_state`).

    Raises:
        CheckpointError: ``path`` does not exist or holds no file.
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"checkpoint {root} does not exist; give workload.checkpoint as an existing file or "
                              "directory")
    files = _files(root)
    if not files:
        raise CheckpointError(f"checkpoint directory {root} holds no file")
    findings: list[Finding] = []
    reports: list[FileReport] = []
    dcp_root = root if root.is_dir() and (root / DCP_METADATA).is_file() else None
    if dcp_root is not None:
        reports += _inspect_dcp(dcp_root, findings)
    for p in files:
        rel = p.name if root.is_file() else p.relative_to(root).as_posix()
        if rel in RESERVED_NAMES:
            findings.append(Finding("reserved_name", "blocker", rel, f"a file named {rel} at the top of the checkpoint",
                                    "the run's store keeps that name for a set's manifest or completion marker, so "
                                    "freezing the checkpoint would overwrite it",
                                    "rename or remove it on the source (a Spark or Hadoop _SUCCESS file carries "
                                    "no weights)"))
        with p.open("rb") as f:
            head = f.read(8)
        if p.name.endswith(INDEX_SUFFIX):
            reports.append(_inspect_index(p, rel, root if root.is_dir() else p.parent, findings))
        elif p.name == DCP_METADATA and dcp_root is not None and p.parent == dcp_root:
            continue  # reported with its shards above
        elif p.suffix == ".distcp":
            reports.append(FileReport(rel, "dcp-shard", p.stat().st_size, sha256_of(p)))
        elif head.startswith(b"PK\x03\x04"):
            if not zipfile.is_zipfile(p):
                reports.append(FileReport(rel, "torch-zip", p.stat().st_size, sha256_of(p)))
                findings.append(Finding("truncated", "blocker", rel, "a zip archive without its central directory",
                                         "the file was cut short (an interrupted copy or upload)",
                                         "copy it again from the source and compare its sha256 with the source's"))
            else:
                reports.append(_inspect_torch(p, rel, True, findings, allow_globals))
        elif head[:1] == b"\x80":
            reports.append(_inspect_torch(p, rel, False, findings, allow_globals))
        elif p.suffix == ".safetensors":
            reports.append(_inspect_safetensors(p, rel, findings))
        elif p.suffix in (".json", ".txt", ".yaml", ".yml", ".md"):  # configs and manifests: hashed, not loaded
            reports.append(FileReport(rel, "metadata", p.stat().st_size, sha256_of(p)))
        else:
            reports.append(FileReport(rel, "unknown", p.stat().st_size, sha256_of(p)))
            if p.suffix in (".pt", ".pth", ".bin", ".ckpt"):
                findings.append(Finding("unknown_format", "blocker", rel, f"first bytes {head!r}",
                                         "the file is neither a torch.save file nor safetensors",
                                         "check what wrote it; re-save the state dict with torch.save or safetensors"))
    return Inspection(str(root), tuple(reports), tuple(findings))


def _inspect_index(p: Path, rel: str, root: Path, findings: list[Finding]) -> FileReport:
    rep = FileReport(rel, "shard-index", p.stat().st_size, sha256_of(p))
    try:
        weight_map = json.loads(p.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        findings.append(Finding("unreadable", "blocker", rel, f"{type(exc).__name__}: {exc}",
                                 "a shard index must be JSON with a weight_map", "copy it again from the source"))
        return rep
    for shard in sorted(set(weight_map.values()), key=natural_key):
        if not (p.parent / shard).is_file():
            names = [k for k, v in weight_map.items() if v == shard]
            findings.append(Finding("missing_shard", "blocker", shard, f"named by {rel} for {len(names)} tensors, "
                                     f"e.g. {names[0]!r}; not in {root}", "a sharded checkpoint loads only whole",
                                     "copy the missing shard from the source and freeze the set again"))
    return rep


@dataclass(frozen=True)
class LoadedState:
    """What :func:`load_state` loaded and every conversion it made.

    Attributes:
        state: the state dict (tensors on ``device``).
        device: where tensors were mapped. remap: ``{saved_tag: device}`` per tag seen.
        stripped_prefix: the wrapper prefix removed from every key, or "".
        allowed_globals: the operator allowlist used (empty unless the file's sha256 matched).
        tied: storage-sharing name groups, after conversion (the same groups as in the file).
    """

    state: dict[str, Any]
    device: str
    remap: dict[str, str]
    stripped_prefix: str
    allowed_globals: tuple[str, ...]
    tied: tuple[tuple[str, ...], ...]


def _import_global(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise CheckpointError(f"allowlisted global {name!r} cannot be imported here ({exc}); install the package "
                              "that defines it in the target image or remove it from workload.allow_globals") from exc


def load_state(path: str | Path, *, device: str = "cpu", allow_globals: Sequence[str] = (),
               frozen_sha256: str = "", reference: dict[str, Any] | None = None) -> LoadedState:
    """Load one torch.save or safetensors file safely (see the module docstring).

    Args:
        device: ``map_location`` for every tensor (``cpu``, ``cuda``, ``cuda:N``).
        allow_globals: ``module.name`` globals the operator trusts; honoured only when
            ``frozen_sha256`` (from the frozen manifest) equals the file's sha256.
        reference: ``{name: tensor or shape}`` the model expects; with it, a wrapper prefix on
            every key is stripped when the stripped names and shapes all match.

    Raises:
        CheckpointError: an unsafe global is named and not allowlisted (or the allowlist was
            given without a matching sha256); the load failed; only some keys carry a prefix;
            tied tensors came apart.
    """
    import torch

    p = Path(path)
    allowed: tuple[str, ...] = ()
    if allow_globals:
        actual = sha256_of(p)
        if not frozen_sha256 or actual != frozen_sha256:
            raise CheckpointError(
                f"workload.allow_globals is honoured only for a file whose sha256 matches the frozen manifest; {p.name} "
                f"has {actual[:16]}…, the manifest {frozen_sha256[:16] or 'none'}. Freeze the checkpoint in phase 01 "
                "and load the frozen copy")
        allowed = tuple(allow_globals)
    tags: list[str] = []

    def remap(storage: Any, loc: str) -> Any:
        tags.append(loc)
        return torch.serialization.default_restore_location(storage, device)

    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(p), device=device)
            tags.append("cpu")
        else:
            with torch.serialization.safe_globals([_import_global(n) for n in allowed]):
                state = torch.load(p, weights_only=True, map_location=remap)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{p.name} names a global outside torch's weights_only allowlist "
                              f"({_refusal(str(exc))}); it was not run. Re-save it with "
                              "tensors only, or list exactly that name in workload.allow_globals") from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{p.name} cannot be loaded: {type(exc).__name__}: {str(exc)[:300]}. Copy it again "
                              "from the source and compare its sha256 with the frozen manifest") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{p.name} holds a {type(state).__name__}, not a state dict; save model.state_dict()")
    before = _tensor_table(state)[2]
    stripped = ""
    if reference is not None:
        state, stripped = _strip_prefix(p.name, state, reference)
    after = _tensor_table(state)[2]
    renamed = {tuple(n.removeprefix(stripped) for n in g) for g in before}
    if renamed != set(after):
        raise CheckpointError(f"{p.name}: tied tensors came apart in conversion (before {sorted(renamed)}, after "
                              f"{sorted(after)}); load it without converting")
    return LoadedState(state, device, {t: device for t in dict.fromkeys(tags)}, stripped, allowed, after)


def strip_wrapper_prefix(state: dict[str, Any], reference: dict[str, Any], *,
                         name: str = "the checkpoint") -> tuple[dict[str, Any], str]:
    """``state`` with a wrapper's prefix (:data:`WRAPPER_PREFIXES`: DataParallel's ``module.``,
    torch.compile's ``_orig_mod.``) removed from every key, for a model that expects ``reference``'s
    keys (``model.state_dict()``, or ``{name: shape}``); returns the state and the prefix stripped
    ("" when the keys already match or carry no wrapper prefix). For an entry point to call before
    ``load_state_dict(..., strict=True)`` (the ``wrapper_prefix`` finding).

    Raises:
        CheckpointError: only some keys carry the prefix, or the stripped keys and shapes are not
            the model's (``name`` says whose state it is in the message).
    """
    return _strip_prefix(name, state, reference)


def _strip_prefix(name: str, state: dict[str, Any], reference: dict[str, Any]) -> tuple[dict[str, Any], str]:
    def shape(v: Any) -> tuple[int, ...]:
        return tuple(v.shape) if hasattr(v, "shape") else tuple(v)

    keys = list(state)
    if set(keys) == set(reference):
        return state, ""
    for prefix in WRAPPER_PREFIXES:
        having = [k for k in keys if k.startswith(prefix)]
        if not having:
            continue
        if len(having) != len(keys):
            raise CheckpointError(f"{name}: {len(having)} of {len(keys)} keys start with {prefix!r}; a prefix on some "
                                  "keys only is not a wrapper's and is not stripped. Re-save the state dict from the "
                                  "unwrapped model")
        out = {k.removeprefix(prefix): v for k, v in state.items()}
        if set(out) == set(reference) and all(shape(out[k]) == shape(reference[k]) for k in out):
            return out, prefix
        raise CheckpointError(f"{name}: stripping {prefix!r} does not give the model's keys and shapes (e.g. "
                              f"{sorted(set(out) ^ set(reference))[:3]}); the checkpoint is for another model")
    return state, ""


def iter_tensor_files(root: str | Path) -> Iterator[Path]:
    """The files of a checkpoint that hold tensors (torch.save or safetensors), in natural order."""
    for p in _files(Path(root)):
        if p.suffix in (".pt", ".pth", ".bin", ".ckpt", ".safetensors") and not p.name.endswith(INDEX_SUFFIX):
            yield p
