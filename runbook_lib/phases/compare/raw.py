"""Phase 04's raw measurement on disk: what the gates are judged from, by phase 04 and by
``runbook verify --recompute`` alike.

Latency samples go to ``04/samples.parquet`` (Apache Parquet through pyarrow), one row group per
round as the round ends, so a long measurement is never held as one list of rows. The smaller
tables (saturation bursts, cold starts, measurement attempts, discarded warm-up) stay CSV. Phase
04 judges the tables as read back from these files (:func:`load_tables`), so a recomputation from
the files takes the very path the phase took.

Schema of ``04/samples.parquet`` (:data:`SAMPLE_SCHEMA`), one row per request (inference) or
timed training step:

=============  =======  ==================================================================
column         type     meaning
=============  =======  ==================================================================
side           string   ``source`` or ``target``
round          int64    round number (interleaved S, T, T, S, ...)
request        int64    request number within the round (training: step number)
intended_s     float64  intended send time, seconds from the round's start (open loop)
sent_s         float64  actual send time, seconds from the round's start
done_s         float64  time the answer arrived, seconds from the round's start
total_s        float64  latency from intended arrival: queue + init + execution, seconds
queue_s        float64  seconds in the endpoint's queue
init_s         float64  seconds of worker initialisation charged to the request
execution_s    float64  seconds of inference (training: the step)
status         string   the served status (``COMPLETED``, ``FAILED``, ``TIMED_OUT``, ...)
batch_size     int64    items in the request
input_index    int64    index of the golden input it carried
accepted       bool     completed within the SLO and matched its golden output
loss           float64  training loss of the step (null for inference)
ttft_s         float64  time to first token, seconds from the send (token-streaming services)
tpot_s         float64  time per output token after the first, seconds (token-streaming services)
output_tokens  float64  output tokens of the answer (token-streaming services)
stage          string   where a failed request failed (``connect``, ``headers``, ``body``,
                        ``first token``, ``mid-stream``, ``status poll``); null when it completed
error          string   a failed request's error, the server's own words first (200 characters,
                        credential shapes redacted); null when it completed
=============  =======  ==================================================================

Timestamps not measured for a kind (training has no intended send time) are null.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from runbook_lib.errors import EvidenceError
from runbook_lib.evidence.records import ClockRow, CompareData, SpendRecord, StoreFetch
from runbook_lib.measure.cost import SpendMeter
from runbook_lib.measure.timing import Attempted, CollectorPauses

THROUGHPUT_COLUMNS = ["side", "round", "requests", "completed", "failed", "elapsed_s", "throughput_units_per_s",
                      "failed_by_status"]
"""Columns of ``04/throughput.csv``: one saturation burst (inference) or training round per row."""

SAMPLES_FILE = "04/samples.parquet"
THROUGHPUT_FILE = "04/throughput.csv"
COLD_STARTS_FILE = "04/cold_starts.csv"
FROM_ZERO_FILE = "04/cold_starts_from_zero.csv"
ATTEMPTS_FILE = "04/measurement_attempts.csv"
WARMUP_FILE = "04/warmup_discarded.csv"
INTER_TOKEN_FILE = "04/inter_token_latency.csv"
"""Token-streaming services: every gap between successive streamed chunks (``side``, ``round``,
``request``, ``itl_s`` seconds), pooled as vLLM ``bench serve`` pools ITL."""
ALLREDUCE_FILE = "04/allreduce.csv"
"""Data-parallel training: one all-reduce benchmark per round of a side with more than one
process (:data:`ALLREDUCE_COLUMNS`)."""
ALLREDUCE_COLUMNS = ["side", "round", "ranks", "backend", "size_bytes", "time_s", "algbw_bytes_per_s",
                     "busbw_bytes_per_s"]
"""Columns of :data:`ALLREDUCE_FILE`: bytes reduced, seconds per all-reduce (the slowest rank's),
algorithm and bus bandwidth in bytes per second (nccl-tests' formulas,
:func:`runbook_lib.workload.ddp.bus_bandwidth`)."""

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("side", "string"), ("round", "int64"), ("request", "int64"), ("intended_s", "float64"), ("sent_s", "float64"),
    ("done_s", "float64"), ("total_s", "float64"), ("queue_s", "float64"), ("init_s", "float64"),
    ("execution_s", "float64"), ("status", "string"), ("batch_size", "int64"), ("input_index", "int64"),
    ("accepted", "bool"), ("loss", "float64"), ("ttft_s", "float64"), ("tpot_s", "float64"),
    ("output_tokens", "float64"), ("stage", "string"), ("error", "string"),
)
OPTIONAL_COLUMNS = ("ttft_s", "tpot_s", "output_tokens", "stage", "error")
"""Columns added after the first schema (with ``kind: service``, then with named failures): a run
recorded before them reads back with them null."""


def sample_schema() -> Any:
    """The pyarrow schema of ``04/samples.parquet`` (see the module docstring)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, "string" if kind == "string" else ("bool_" if kind == "bool" else kind))())
                      for name, kind in _COLUMNS])


TableRow = dict[str, Any]
"""One row of a table phase 04 writes (a cold start, a warm-up request, a saturation burst, a
latency sample): column name to value, as pandas and pyarrow take rows; the files above name the
tables and :data:`JUDGED_COLUMNS` the sample columns the gates read."""


def _cell(v: Any) -> Any:
    """A value as Parquet keeps it: a missing number (None or NaN) is null, whatever the column's type."""
    return None if v is None or (isinstance(v, float) and v != v) else v


class SampleSink:
    """Appends latency samples to ``04/samples.parquet`` as they arrive, one row group per call.

    Args:
        path: the Parquet file (created, or replaced, on the first write or on :meth:`close`).

    Use as a context manager, or call :meth:`close`; a sink closed without rows still writes a
    valid file with the schema and no rows, so a measurement that produced nothing is evidence too.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._writer: Any = None

    def write(self, rows: Sequence[TableRow]) -> None:
        """Append ``rows`` (dicts with the schema's columns; missing ones are null, others ignored)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not rows:
            return
        schema = sample_schema()
        names = schema.names
        table = pa.Table.from_pylist([{k: _cell(r.get(k)) for k in names} for r in rows], schema=schema)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, schema)
        self._writer.write_table(table)
        self.rows += len(rows)

    def write_frame(self, frame: pd.DataFrame) -> None:
        """Append a DataFrame of samples (the schema's columns; others ignored) as one row group."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not len(frame):
            return
        schema = sample_schema()
        frame = frame.reindex(columns=schema.names)
        table = pa.Table.from_pydict({k: [_cell(v) for v in frame[k].tolist()] if kind in ("int64", "bool", "string") else
                                      frame[k].to_numpy() for k, kind in _COLUMNS}, schema=schema)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, schema)
        self._writer.write_table(table)
        self.rows += len(frame)

    def close(self) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            pq.write_table(sample_schema().empty_table(), self.path)
        else:
            self._writer.close()
        self._writer = None

    def __enter__(self) -> SampleSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


JUDGED_COLUMNS = ("side", "round", "status", "intended_s", "sent_s", "done_s", "total_s", "queue_s", "init_s", "execution_s",
                  "accepted", *OPTIONAL_COLUMNS)
"""The columns phase 04's gates, summary and plots read (the others stay in the file for the audit)."""


CATEGORICAL_COLUMNS = ("side", "status", "stage", "error")
"""The sample columns of text, read as pandas categoricals: a few distinct values (``stage``,
``error`` null but for failed requests), so a code byte a row instead of a string object."""


def read_samples(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """``04/samples.parquet`` as a DataFrame: ``columns`` (default: all of the schema), nulls as
    NaN, the text columns (:data:`CATEGORICAL_COLUMNS`) as categoricals.

    Memory: the file is read one row group at a time (the sink writes one per call) into columns
    allocated once at the file's row count, so the peak is the frame plus one row group, not the
    whole Arrow table beside its pandas copy; through the system allocator, so each group's
    decompression buffers go back to the operating system as soon as they are freed (pyarrow's
    default pool keeps them). A million samples read this way in about 0.3 s.

    Raises:
        EvidenceError: the file is missing or is not a Parquet file of this schema.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.exists():
        raise EvidenceError(f"{path} is missing: phase 04's raw samples cannot be read; re-run phase 04")
    wanted = list(columns or sample_schema().names)
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        pf = pq.ParquetFile(path)
        present = pf.schema_arrow.names
        missing = [n for n in wanted if n not in present and n not in OPTIONAL_COLUMNS]
        if missing:
            raise EvidenceError(f"{path} lacks columns {missing} of the documented schema "
                                "(runbook_lib.phases.compare.raw)")
        read = [n for n in wanted if n in present]
        frame = _row_groups(pf, read, categorical=[c for c in CATEGORICAL_COLUMNS if c in read])
        for n in wanted:
            if n not in frame.columns:
                frame[n] = float("nan")
        return frame[wanted]
    except (OSError, pa.ArrowException) as e:
        raise EvidenceError(f"{path} is not a readable Parquet file ({e}); re-run phase 04") from e
    finally:
        pa.set_memory_pool(previous)


def _row_groups(pf: Any, columns: list[str], *, categorical: list[str]) -> pd.DataFrame:
    """The ``columns`` of the Parquet file ``pf`` as one DataFrame, filled row group by row group
    into arrays allocated once (a column whose type widens in a later group, an integer column
    meeting its first null, is widened then). ``categorical`` columns are combined as pandas
    categoricals (their codes, one byte a row)."""
    n = pf.metadata.num_rows
    arrays: dict[str, np.ndarray] = {}
    cats: dict[str, list[pd.Categorical]] = {c: [] for c in categorical}
    at = 0
    for i in range(pf.num_row_groups):
        part = pf.read_row_group(i, columns=columns).to_pandas(self_destruct=True, split_blocks=True)
        rows = len(part)
        for c in columns:
            if c in cats:
                cats[c].append(pd.Categorical(part[c]))
                continue
            values = part[c].to_numpy()
            if c not in arrays:
                arrays[c] = np.empty(n, dtype=values.dtype)
            elif np.result_type(arrays[c].dtype, values.dtype) != arrays[c].dtype:
                arrays[c] = arrays[c].astype(np.result_type(arrays[c].dtype, values.dtype))
            arrays[c][at:at + rows] = values
        del part
        at += rows
    out = {c: arrays.get(c, np.empty(0)) for c in columns if c not in cats}
    for c, parts in cats.items():
        out[c] = pd.api.types.union_categoricals(parts) if parts else pd.Categorical([])
    return pd.DataFrame(out, columns=columns, copy=False)


def _csv(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=columns or [])
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=columns or [])


@dataclass
class Measured:
    """Phase 04's measurement: the tables its gates judge and what the record keeps beside them.

    Attributes:
        samples: one row per latency sample (:data:`JUDGED_COLUMNS`; seconds from intended arrival).
        throughput: one row per saturation burst or training round (:data:`THROUGHPUT_COLUMNS`;
            units per second).
        cold_starts: one row per side's first start (inference: create call to first served
            response; training: pod creation to first step), seconds.
        attempts: every measurement taken through retries (:class:`runbook_lib.measure.timing.Attempted`).
        billed_s: seconds each side was billed. egress_bytes: bytes each side's answers sent.
        spend: the spend limit as enforced.
        warmup: warm-up requests or steps, recorded and left out of every gate.
        cold_starts_from_zero: one row per scale-from-zero start (both sides queue endpoints), or None.
        target_workers_ready: target workers serving after the rounds (inference), or None.
        endpoints, endpoint_urls, endpoint_modes: each side's measured endpoint (inference; kept
            for phase 05). extra_rounds: rounds run past ``measure.rounds``. pair_s: each pair of
            rounds' wall seconds (``gates.method: sequential``).
        store_to_pod: each pod's verified download of the set it started from.
        clocks: the three clocks and what each ended (inference).
        load_generator_gc: the measuring process's garbage collections (inference).
        inter_token: token-streaming services: every inter-token gap (:data:`INTER_TOKEN_FILE`), or None.
        allreduce: data-parallel training: each round's all-reduce benchmark (:data:`ALLREDUCE_FILE`), or None.
        meter: the live spend meter (None when rebuilt from a run's files).
    """

    samples: pd.DataFrame
    throughput: pd.DataFrame
    cold_starts: pd.DataFrame
    attempts: list[Attempted[Any]]
    billed_s: dict[str, float]
    egress_bytes: dict[str, float]
    spend: SpendRecord
    warmup: pd.DataFrame = field(default_factory=pd.DataFrame)
    cold_starts_from_zero: pd.DataFrame | None = None
    target_workers_ready: int | None = None
    endpoints: dict[str, str] = field(default_factory=dict)
    endpoint_urls: dict[str, str] = field(default_factory=dict)
    endpoint_modes: dict[str, str] = field(default_factory=dict)
    extra_rounds: int = 0
    pair_s: list[float] = field(default_factory=list)
    store_to_pod: list[StoreFetch] = field(default_factory=list)
    clocks: list[ClockRow] = field(default_factory=list)
    load_generator_gc: CollectorPauses | None = None
    meter: SpendMeter | None = None
    inter_token: pd.DataFrame | None = None
    allreduce: pd.DataFrame | None = None


def write_tables(run_dir: Path, res: Measured) -> None:
    """Write the small tables of a measurement (samples are already in ``04/samples.parquet``)."""
    pd.DataFrame([row for a in res.attempts for row in a.to_rows()],
                 columns=["what", "kind", "side", "attempt", "ok", "seconds", "error"]
                 ).to_csv(run_dir / ATTEMPTS_FILE, index=False)
    res.throughput.to_csv(run_dir / THROUGHPUT_FILE, index=False)
    res.cold_starts.to_csv(run_dir / COLD_STARTS_FILE, index=False)
    if res.cold_starts_from_zero is not None:
        res.cold_starts_from_zero.to_csv(run_dir / FROM_ZERO_FILE, index=False)
    res.warmup.to_csv(run_dir / WARMUP_FILE, index=False)
    if res.inter_token is not None:
        res.inter_token.to_csv(run_dir / INTER_TOKEN_FILE, index=False)
    if res.allreduce is not None:
        res.allreduce.to_csv(run_dir / ALLREDUCE_FILE, index=False)


def attempts_from_rows(df: pd.DataFrame) -> list[Attempted[Any]]:
    """Measurements rebuilt from ``04/measurement_attempts.csv``: one :class:`Attempted` per
    (what, kind, side) in file order, with its attempts (values are not kept, only whether each
    attempt succeeded and why not)."""
    out: list[Attempted[Any]] = []
    if not len(df):
        return out
    keys: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in df.to_dict("records"):
        err = row.get("error")
        keys.setdefault((str(row["what"]), str(row["kind"]), str(row["side"])), []).append(
            {"attempt": int(row["attempt"]), "ok": bool(row["ok"]), "seconds": float(row["seconds"]),
             "error": None if err is None or (isinstance(err, float) and err != err) else str(err)})
    for (what, kind, side), attempts in keys.items():
        out.append(Attempted(what, kind, side, None, tuple(attempts)))
    return out


@dataclass(frozen=True)
class Tables:
    """The measurement's tables as phase 04's gates read them back from the run's files."""

    samples: pd.DataFrame
    throughput: pd.DataFrame
    cold_starts: pd.DataFrame
    attempts: list[Attempted[Any]]
    cold_starts_from_zero: pd.DataFrame | None
    inter_token: pd.DataFrame | None = None
    allreduce: pd.DataFrame | None = None


def load_tables(run_dir: Path) -> Tables:
    """The measurement's tables as phase 04's gates read them: ``samples`` (Parquet), ``throughput``,
    ``cold_starts``, ``cold_starts_from_zero`` and ``allreduce`` (when measured) and ``attempts``.

    Raises:
        EvidenceError: ``04/samples.parquet`` is missing or unreadable.
    """
    zero, itl, ar = run_dir / FROM_ZERO_FILE, run_dir / INTER_TOKEN_FILE, run_dir / ALLREDUCE_FILE
    return Tables(samples=read_samples(run_dir / SAMPLES_FILE, JUDGED_COLUMNS),
                  throughput=_csv(run_dir / THROUGHPUT_FILE, THROUGHPUT_COLUMNS),
                  cold_starts=_csv(run_dir / COLD_STARTS_FILE, ["side", "cold_start_s"]),
                  attempts=attempts_from_rows(_csv(run_dir / ATTEMPTS_FILE)),
                  cold_starts_from_zero=_csv(zero) if zero.exists() else None,
                  inter_token=_csv(itl, ["side", "round", "request", "itl_s"]) if itl.exists() else None,
                  allreduce=_csv(ar, ALLREDUCE_COLUMNS) if ar.exists() else None)


RECORDED_SCALARS = ("billed_s", "egress_bytes", "target_workers_ready", "spend")
"""What phase 04's record keeps beside the raw tables that the gates need: billed seconds and
egress bytes per side, the target workers serving after the rounds, and the spend meter's stops."""


def load_measurement(run_dir: Path, record: CompareData) -> Measured:
    """A measurement rebuilt from a run directory: :func:`load_tables` plus
    :data:`RECORDED_SCALARS` from phase 04's record data.

    Raises:
        EvidenceError: a raw file is missing or unreadable, or the record lacks a scalar (a run made
            before it was recorded).
    """
    missing = [k for k in RECORDED_SCALARS if k not in record.model_fields_set]
    if missing or record.billed_s is None or record.egress_bytes is None or record.spend is None:
        raise EvidenceError(f"phase 04's record in {run_dir} lacks {missing or list(RECORDED_SCALARS)}: this run cannot "
                            "be recomputed (it was made by a runbook that did not record them)")
    t = load_tables(run_dir)
    return Measured(samples=t.samples, throughput=t.throughput, cold_starts=t.cold_starts, attempts=t.attempts,
                    cold_starts_from_zero=t.cold_starts_from_zero, inter_token=t.inter_token, allreduce=t.allreduce,
                    billed_s=record.billed_s,
                    egress_bytes=record.egress_bytes, spend=record.spend,
                    target_workers_ready=record.target_workers_ready, pair_s=list(record.pair_seconds))
