"""What a probed Horovod rank records, typed: ``probe.N.json``, ``allreduce.N.json``, and what lab 9's check reads of
its profile and its elastic run.

A probed rank (:mod:`labkit.instrument.probe`) fills in a :class:`RankRecord` as the script runs and writes it
(:func:`labkit.records.typed.dump`); :func:`labkit.check.hvd_runs.run` reads each rank's file back once, every field
checked (:func:`labkit.records.evidence.record`), and keeps it in the check's evidence
(:mod:`labkit.records.hvd_evidence`), which the judges of the Horovod, communication and at-scale labs read.

Values a learner's script passed to ``fit`` (``verbose``, ``epochs``, ``validation_steps``...) are kept as the JSON
value recorded (``Any``): a script may pass an int, a string or a NumPy number, and each judge says what it expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.records import typed


@dataclass(frozen=True)
class Failure:
    """The exception that ended a rank's script."""

    type: str = ""
    message: str = ""
    traceback: str = ""


@dataclass(frozen=True)
class HorovodState:
    """What Horovod said at the rank's last milestone (``local_rank`` as the probe mirrors it to the script)."""

    initialized: bool = False
    rank: int | None = None
    size: int | None = None
    local_rank: int | None = None
    error: str | None = None


@dataclass
class Pins:
    """The GPUs the script made visible, asked memory growth for, and ``CUDA_VISIBLE_DEVICES`` at the end."""

    visible: list[str] | None = None
    memory_growth: list[list[Any]] = field(default_factory=list)
    cuda_visible_devices: str | None = None


@dataclass(frozen=True)
class FitCall:
    """One call of ``Model.fit``: the arguments the judges read, the callbacks and optimizer by class name."""

    verbose: Any = None
    epochs: Any = None
    initial_epoch: Any = None
    steps_per_epoch: Any = None
    validation_steps: Any = None
    has_validation: bool = False
    callbacks: list[str] = field(default_factory=list)
    optimizer: str | None = None
    cuda_visible_devices: str | None = None


@dataclass(frozen=True)
class EvaluateCall:
    """One call of ``Model.evaluate`` outside fit."""

    verbose: Any = None


@dataclass(frozen=True)
class Save:
    """One save of a model, its weights or a checkpoint."""

    kind: str = ""
    path: str = ""
    epoch: int | None = None
    in_fit: bool = False


@dataclass(frozen=True)
class CallbackRead:
    """What one of the script's callbacks read from the epoch's logs, and the values they held then."""

    callback: str = ""
    index: int = 0
    epoch: int = 0
    read: list[str] = field(default_factory=list)
    seen: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Epoch:
    """One epoch of training: the batches run, the logs at its end, the learning rate of every batch."""

    epoch: int = 0
    train_batches: int = 0
    val_batches: int = 0
    final_logs: dict[str, float] = field(default_factory=dict)
    lr: list[float | None] = field(default_factory=list)
    reads: list[CallbackRead] = field(default_factory=list)
    # Per training batch, as it ran: how far the trainable weights moved (the norm of their change since the
    # previous batch's end; 0.0: no update), how many gradient tensors Horovod all-reduced, and the norm of what
    # those all-reduces returned (:mod:`labkit.instrument.probe_allreduce`).
    moved: list[float] = field(default_factory=list)
    reduced: list[int] = field(default_factory=list)
    reduced_norm: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class LayerDtypes:
    """One layer of the model: its class, the dtype it computes in, the dtypes of its own variables."""

    name: str = ""
    kind: str = ""
    compute: str | None = None
    variables: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ModelDtypes:
    """The model ``fit`` trained: its layers' dtypes, its outputs' dtypes, how many non-trainable values it holds
    (BatchNorm's moving statistics)."""

    layers: list[LayerDtypes] = field(default_factory=list)
    outputs: list[str] | None = None
    non_trainable: int = 0


@dataclass(frozen=True)
class DataSize:
    """The images each rank was given."""

    train: int = 0
    test: int = 0


@dataclass(frozen=True)
class FitBound:
    """A rank stopped because it had not called fit in time."""

    bound_s: float = 0.0
    after_s: float = 0.0
    patched_s: float | None = None


@dataclass(frozen=True)
class FitRule:
    """The rule the bound came from: ``factor`` times the TensorFlow import, plus ``floor_s``."""

    factor: float = 0.0
    floor_s: float = 0.0


@dataclass
class RankRecord:
    """``probe.N.json``: everything one probed rank saw (the probe's :class:`labkit.instrument.probe_record.Rank`
    fills it in as the script runs and rewrites the file at every milestone)."""

    rank_env: int = 0
    milestones: list[str] = field(default_factory=list)
    hvd: HorovodState = field(default_factory=HorovodState)
    pins: Pins = field(default_factory=Pins)
    fit: list[FitCall] = field(default_factory=list)
    evaluate: list[EvaluateCall] = field(default_factory=list)
    saves: list[Save] = field(default_factory=list)
    epochs: list[Epoch] = field(default_factory=list)
    data: DataSize = field(default_factory=DataSize)
    error: Failure | None = None
    times: dict[str, float] = field(default_factory=dict)
    fit_bound: FitBound | None = field(default=None, metadata=typed.OMIT_NONE)
    fit_rule: FitRule | None = field(default=None, metadata=typed.OMIT_NONE)
    ignored_args: list[str] | None = field(default=None, metadata=typed.OMIT_NONE)  # options the script lacks
    hvd_import_error: str | None = field(default=None, metadata=typed.OMIT_NONE)
    exit_code: int | None = field(default=None, metadata=typed.OMIT_NONE)
    epoch: int | None = field(default=None, metadata=typed.OMIT_NONE)  # the epoch training is in
    in_fit: bool | None = field(default=None, metadata=typed.OMIT_NONE)  # inside fit (None: fit never called)
    model: ModelDtypes | None = field(default=None, metadata=typed.OMIT_NONE)  # as fit began

    def reached(self, milestone: str) -> bool:
        return milestone in self.milestones


@dataclass(frozen=True)
class Allreduced:
    """``allreduce.N.json``: the tensors a rank all-reduced, by dtype, in training steps and elsewhere; or why the
    probe could not count them (``error`` alone)."""

    gradients: dict[str, int] | None = field(default=None, metadata=typed.OMIT_NONE)
    other: dict[str, int] | None = field(default=None, metadata=typed.OMIT_NONE)
    error: str | None = field(default=None, metadata=typed.OMIT_NONE)


@dataclass(frozen=True)
class Profiled:
    """What a rank left in its ``--profile-dir`` (lab 9): how many trace files, and in the newest the training steps
    and the Horovod collectives they started, or why it could not be read."""

    files: int = 0
    steps: int = 0
    collectives: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ElasticWorker:
    """One process of lab 9's elastic run that called ``fit``: its rank when it started, each call of ``fit``
    (its ``initial_epoch``, its ``epochs`` and its start) and each epoch it finished (as tf.keras numbers it,
    1-based, and its end); times in seconds since the job began."""

    pid: int
    rank: int | None = None
    fits: list[int] = field(default_factory=list)
    fit_starts: list[float] = field(default_factory=list)
    fit_epochs: list[int] = field(default_factory=list)  # 0: not a number
    epochs: list[int] = field(default_factory=list)
    epoch_ends: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ElasticRun:
    """Lab 9's elastic run on one host: 2 workers, one slot taken away once rank 0 finished ``leave_after`` epochs
    and given back once it finished ``away`` more; when (seconds since the job began), how the job ended, and
    every process that trained."""

    epochs: int
    leave_after: int
    away: int
    ok: bool = False
    summary: str = ""
    refused: bool = False  # the script does not accept --elastic
    left: float | None = None
    returned: float | None = None
    stopped: str | None = None  # why the check stopped the job
    workers: list[ElasticWorker] = field(default_factory=list)
