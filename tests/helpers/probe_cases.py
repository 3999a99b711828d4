"""The scripts the checks' judges are tested on, and the command that records their evidence.

Each case is a script (a step solution, a starter, or a solution with edits) and what its
check must say. ``python tests/probe_cases.py [--lab LAB] [--case NAME]`` runs each case once
under its lab's probe and writes ``tests/fixtures/probes/<lab>/<case>.json``; the
``test_lab_*`` tests judge those files offline. Run it after changing a probe or a lab
script (``make probe-fixtures``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers import paths

ROOT = paths.ROOT
FIXTURES = ROOT / "tests" / "fixtures" / "probes"
SEEDS = ROOT.parent / "shared" / "seeds"


@dataclass(frozen=True)
class Case:
    lab: str
    name: str
    source: str  # "labs/...", "solutions/..." or "seed:<start>|<end>" (the original lab's text)
    passes: int  # steps 1..passes pass
    hint: str = ""  # what the first failing step's message must contain
    edits: tuple[tuple[str, str], ...] = ()
    step: int | None = None  # the step asked for (default: all)
    transform: Callable[[str], str] | None = None  # a change edits cannot express

    def script(self, folder: Path) -> Path:
        """Write the case's script into ``folder``."""
        if self.source.startswith("seed:"):
            start, end = self.source[5:].split("|")
            seed = next(iter(sorted(SEEDS.glob("004_*.txt"))), None)
            if seed is None:
                raise FileNotFoundError("the original lab's text is not beside this checkout")
            s = seed.read_text()
            i = s.index(start) + len(start)
            text = s[i : s.index(end, i)].strip("\n") + "\n"
        else:
            text = (ROOT / self.source).read_text()
        for old, new in self.edits:
            if old not in text:
                raise ValueError(f"{self.name}: edit target missing from {self.source}: {old!r}")
            text = text.replace(old, new)
        if self.transform:
            text = self.transform(text)
        path = folder / f"{self.name}.py"
        path.write_text(text)
        return path

    @property
    def fixture(self) -> Path:
        return FIXTURES / self.lab / f"{self.name}.json"


def _steps(lab: str, stem: str, n: int) -> list[Case]:
    """The starter fails step 1; the solution after step k passes k and fails k+1."""
    out = [Case(lab, "starter", f"labs/{stem}.py", 0)]
    out += [Case(lab, f"after_step_{k:02d}", f"solutions/{stem}_after_step_{k:02d}.py", k) for k in range(1, n + 1)]
    return out


HVD = "solutions/fashion_mnist_after_step_06.py"
HVD7 = "solutions/fashion_mnist_after_step_07.py"
HVD8 = "solutions/fashion_mnist_after_step_08.py"
NOT_SCALED = "never rose above --base-lr"  # the step-7 script's failure of the learning-rate step
WARMUP = ("    callbacks.append(hvd.callbacks.LearningRateWarmupCallback(\n"
          "        initial_lr=base_lr, warmup_epochs=args.warmup_epochs, verbose=verbose, "
          "momentum_correction=False))\n")
SCHEDULER = ("    callbacks: list[tf.keras.callbacks.Callback] = "
             "[tf.keras.callbacks.LearningRateScheduler(lr_schedule(base_lr))]\n")
LOAD = "        model.load_weights(checkpoint_format.format(epoch=resume_from_epoch))\n"
MIR = "solutions/fashion_mnist_mirrored_after_step_04.py"
MW2 = "solutions/fashion_mnist_multiworker_after_step_02.py"
MW4 = "solutions/fashion_mnist_multiworker_after_step_04.py"
MW5 = "solutions/fashion_mnist_multiworker_after_step_05.py"
PS = "solutions/fashion_mnist_ps_after_step_03.py"
AT_SCALE = "solutions/fashion_mnist_at_scale_after_step_05.py"
AT_SCALE_4 = "solutions/fashion_mnist_at_scale_after_step_04.py"  # one elastic run fewer for what fails earlier

CUSTOM_LOOP = '''
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        loss_fn = tf.keras.losses.CategoricalCrossentropy(reduction="none")

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(train_input)

    per_worker = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def step(it):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch_size)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        x, y = next(it)
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    for epoch in range(args.epochs):
        for _ in range(steps_per_epoch):
            coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        print(f"epoch {epoch + 1} done", flush=True)
    return 0
'''



def _custom_loop(text: str) -> str:
    """Train with ClusterCoordinator.schedule in a loop of its own instead of fit."""
    start = text.index("    os.makedirs(args.log_dir, exist_ok=True)")
    end = text.index('\n\nif __name__ == "__main__":')
    return text[:start] + CUSTOM_LOOP + text[end:]


CASES: list[Case] = [
    # Horovod: the eight steps, wrong scripts failing at the right step, other correct ways passing.
    *[Case(c.lab, c.name, c.source, c.passes, {6: "--checkpoint-dir", 7: NOT_SCALED}.get(c.passes, ""))
      for c in _steps("horovod", "fashion_mnist", 8)],
    Case("horovod", "pin_by_rank", HVD, 0, "hvd.local_rank()", (("gpus[hvd.local_rank()]", "gpus[hvd.rank()]"),)),
    Case("horovod", "broadcast_from_rank1", HVD, 3, "rank 0",
         (("BroadcastGlobalVariablesCallback(0)", "BroadcastGlobalVariablesCallback(1)"),)),
    # Step 5's validation: a shard's worth per worker is a correct way too, given as validation_steps or by a
    # sharded test set that fit runs through (judged up to step 6: these recordings have no checkpoint runs);
    # the whole test set per worker, or 3x it, is validation_steps not divided by the workers.
    Case("horovod", "validation_not_tripled", HVD, 6, "",
         (("3 * validation_steps // hvd.size()", "validation_steps // hvd.size()"),), step=6),
    Case("horovod", "validation_sharded_no_steps", HVD, 6, "", (
        ("               .shuffle(len(x_test)).repeat()\n", "               .shard(hvd.size(), hvd.rank())\n"),
        ("validation_data=test_ds, validation_steps=validation_steps,", "validation_data=test_ds,"),
        ("model.evaluate(test_ds, steps=test_steps,", "model.evaluate(test_ds,")), step=6),
    Case("horovod", "validation_not_divided", HVD, 4, "validation_steps=12 was not divided by the 2 workers",
         (("3 * validation_steps // hvd.size()", "3 * validation_steps"),)),
    Case("horovod", "validation_whole_test_set", HVD, 4, "validation_steps=4 was not divided by the 2 workers",
         (("3 * validation_steps // hvd.size()", "validation_steps"),)),
    Case("horovod", "metric_average_after_reader", HVD, 5, "read val_", (
        ("    callbacks.append(hvd.callbacks.MetricAverageCallback())\n", ""),
        ("    callbacks.append(StopAtAccuracy(args.target_accuracy, args.patience, verbose))\n",
         "    callbacks.append(StopAtAccuracy(args.target_accuracy, args.patience, verbose))\n"
         "    callbacks.append(hvd.callbacks.MetricAverageCallback())\n"))),
    Case("horovod", "crash_on_rank1", HVD, 0, "rank 1 crashed", (
        ("    args = parse_args(argv)\n",
         "    args = parse_args(argv)\n    if hvd.rank() == 1:\n        raise RuntimeError('boom on rank 1')\n"),)),
    Case("horovod", "written_differently", HVD, 6, "", (  # CUDA_VISIBLE_DEVICES, int() verbose, explicit broadcast
        ("    gpus = tf.config.list_physical_devices(\"GPU\")\n    if gpus:\n"
         "        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)\n"
         "        tf.config.set_visible_devices(gpus[hvd.local_rank()], \"GPU\")\n",
         "    os.environ[\"CUDA_VISIBLE_DEVICES\"] = str(hvd.local_rank())\n"),
        ("verbose = 1 if hvd.rank() == 0 else 0", "verbose = int(hvd.rank() == 0)"),
        ("    callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))\n", ""),
        ("    model.compile(loss=\"categorical_crossentropy\", optimizer=opt, metrics=[\"accuracy\"])\n",
         "    model.compile(loss=\"categorical_crossentropy\", optimizer=opt, metrics=[\"accuracy\"])\n"
         "    import horovod.tensorflow as hvd_tf\n"
         "    hvd_tf.broadcast_variables(model.variables, root_rank=0)\n"))),
    Case("horovod", "checkpoint_on_every_rank", HVD7, 6, "saved checkpoints too",
         (("if args.checkpoint_dir and hvd.rank() == 0:", "if args.checkpoint_dir:"),), step=7),
    Case("horovod", "resume_epoch_not_broadcast", HVD7, 6, "Broadcast the epoch", ((
        '    resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))\n', ""),),
         step=7),
    Case("horovod", "no_initial_epoch", HVD7, 6, "initial_epoch", (("initial_epoch=resume_from_epoch,", ""),),
         step=7),
    Case("horovod", "checkpoint_not_loaded", HVD7, 6, "checkpoint's weights",
         ((LOAD, "        pass\n"),), step=7),
    Case("horovod", "plain_load_model", HVD7, 6, "optimizer", ((  # a model whose optimizer does not average
        LOAD, "        model = tf.keras.models.load_model(checkpoint_format.format(epoch=resume_from_epoch))\n"),),
         step=7),
    Case("horovod", "weights_checkpoint", HVD7, 7, "", (  # weights-only files, the epoch broadcast as an object
        ('"checkpoint-{epoch}.h5"', '"weights-{epoch}.h5"'),
        ("ModelCheckpoint(checkpoint_format)", "ModelCheckpoint(checkpoint_format, save_weights_only=True)"),
        ("import horovod.tensorflow.keras as hvd  # Horovod: the Keras API of Horovod\n",
         "import horovod.tensorflow as hvd_tf\nimport horovod.tensorflow.keras as hvd\n"),
        ('int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))',
         "hvd_tf.broadcast_object(resume_from_epoch, 0)")), step=7),
    # Step 8: the learning rate scaled and warmed up, however the script sets it.
    Case("horovod", "scaled_no_warmup", HVD8, 7, "no warm-up", ((WARMUP, ""),)),
    Case("horovod", "warmup_momentum_corrected", HVD8, 2, "momentum_correction=False",
         (("verbose=verbose, momentum_correction=False))", "verbose=verbose))"),)),
    Case("horovod", "warmup_by_scheduler", HVD8, 8, "", (  # the lab's own schedule ramps from --base-lr
        (WARMUP, ""), ("lr_schedule(base_lr))]", "lr_schedule(base_lr, args.warmup_epochs, start_lr=args.base_lr))]"))),
    Case("horovod", "warmup_schedule_object", HVD8, 8, "", (  # a LearningRateSchedule, no callback
        (WARMUP, ""), (SCHEDULER, "    callbacks: list[tf.keras.callbacks.Callback] = []\n"),
        ("    opt = tf.keras.optimizers.SGD(learning_rate=base_lr)\n",
         "    warmup_steps = args.warmup_epochs * steps_per_epoch\n"
         "    ramp = tf.keras.optimizers.schedules.PolynomialDecay(\n"
         "        args.base_lr, warmup_steps, end_learning_rate=base_lr, power=1.0)\n"
         "    opt = tf.keras.optimizers.SGD(learning_rate=ramp)\n"))),
    Case("horovod", "original_solution", "seed:fashion_mnist_solution.py\n|参考资料", 6, "--checkpoint-dir"),
    Case("horovod", "original_starter", "seed:fashion_mnist.py:\n|基准", 0, "hvd.init()"),
    # MirroredStrategy
    *_steps("mirrored", "fashion_mnist_mirrored", 4),
    Case("mirrored", "one_device", MIR, 0, "1 replica",
         (("[tf.config.LogicalDeviceConfiguration()] * n_cpu", "[tf.config.LogicalDeviceConfiguration()]"),)),
    Case("mirrored", "written_differently", MIR, 4, "", (
        ("global_batch = args.batch_size * replicas",
         "global_batch = len(strategy.extended.worker_devices) * args.batch_size"),
        ("    model.save(args.model_path)\n", "    tf.keras.models.save_model(model, args.model_path)\n"),
        ("    with strategy.scope():\n        restored", "    if True:\n        restored"))),
    Case("mirrored", "arrays_to_fit", MIR, 4, "", ((
        "        train_ds,\n        steps_per_epoch=steps_per_epoch,\n",
        "        (x_train.astype(\"float32\") - mean) / std, tf.keras.utils.to_categorical(y_train, 10),\n"
        "        batch_size=global_batch,\n"),)),
    Case("mirrored", "distributed_dataset", MIR, 4, "", ((
        "    steps_per_epoch = math.ceil(",
        "    train_ds = strategy.experimental_distribute_dataset(train_ds)\n    steps_per_epoch = math.ceil("),)),
    Case("mirrored", "global_batch_not_scaled", MIR, 2, "batches of",
         (("    global_batch = args.batch_size * replicas\n", "    global_batch = args.batch_size\n"),)),
    # MultiWorkerMirroredStrategy (step 4 kills and restarts a worker: only asked of scripts that pass step 3)
    *[Case("multiworker", c.name, c.source, c.passes, NOT_SCALED if c.passes == 4 else c.hint,
           step=min(c.passes + 1, 5) if c.passes >= 3 else 3)
      for c in _steps("multiworker", "fashion_mnist_multiworker", 5)],
    Case("multiworker", "not_sharded", MW2, 1, "same examples", (("AutoShardPolicy.DATA", "AutoShardPolicy.OFF"),),
         step=3),
    Case("multiworker", "sharded_by_hand", MW4, 3, "", (
        ("train_ds = train_ds.shuffle(len(x_train), seed=args.seed)",
         "train_ds = train_ds.shard(replicas, strategy.cluster_resolver.task_id or 0).shuffle(len(x_train))"),
        ("options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA",
         "options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF")), step=3),
    Case("multiworker", "dataset_from_function", MW4, 3, "", ((
        "    steps_per_epoch = math.ceil(",
        "    def train_input(ctx: tf.distribute.InputContext) -> tf.data.Dataset:\n"
        "        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))\n"
        "        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).shuffle(len(x_train)).repeat()\n"
        "        return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True).map(\n"
        "            standardize(mean, std))\n\n"
        "    train_ds = strategy.distribute_datasets_from_function(train_input)\n"
        "    steps_per_epoch = math.ceil("),), step=3),
    # ParameterServerStrategy. Step 3 asks for an effect (each worker its own input pipeline), which fit
    # already gives a plain tf.data.Dataset: the step-2 script meets it.
    Case("parameter-server", "starter", "labs/fashion_mnist_ps.py", 0),
    Case("parameter-server", "after_step_01", "solutions/fashion_mnist_ps_after_step_01.py", 1),
    Case("parameter-server", "after_step_02", "solutions/fashion_mnist_ps_after_step_02.py", 3),
    Case("parameter-server", "after_step_03", PS, 3),
    Case("parameter-server", "plain_dataset", PS, 3, "", ((
        "train_ds = tf.keras.utils.experimental.DatasetCreator(train_input)",
        "train_ds = (tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train)).repeat()\n"
        "                .batch(args.batch_size, drop_remainder=True).map(standardize(mean, std)))"),)),
    Case("parameter-server", "custom_loop", PS, 3, transform=_custom_loop),
    Case("parameter-server", "servers_return", PS, 0, "instead of serving",
         (("        server.join()  # runs until the cluster is stopped\n", ""),)),
    # At scale (lab 9): the three options, wrong scripts failing at the right step, other correct ways passing.
    Case("at-scale", "lab8_finished", "solutions/fashion_mnist_communication_after_step_01.py", 0,
         "does not accept --accumulate"),
    *[Case("at-scale", f"after_step_{k:02d}", f"solutions/fashion_mnist_at_scale_after_step_{k:02d}.py", k,
           {1: "does not accept --sync-bn", 2: "does not accept --precision", 3: "does not accept --profile-dir",
            4: "does not accept --elastic"}.get(k, "")) for k in (1, 2, 3, 4, 5)],
    Case("at-scale", "accumulate_ignored", AT_SCALE_4, 0, "at every batch",
         (("backward_passes_per_step=args.accumulate,", "backward_passes_per_step=1,"),)),
    Case("at-scale", "summed_not_scaled", AT_SCALE_4, 4, "", (  # summed gradients at the workers' rate: the same step
        ("average_aggregated_gradients=True", "average_aggregated_gradients=False"),
        ("    base_lr *= args.accumulate\n", ""))),
    Case("at-scale", "summed_and_scaled", AT_SCALE_4, 0, "above",
         (("average_aggregated_gradients=True", "average_aggregated_gradients=False"),)),
    Case("at-scale", "rate_not_scaled", AT_SCALE_4, 0, "rose to", (("    base_lr *= args.accumulate\n", ""),)),
    Case("at-scale", "rate_scaled_twice", AT_SCALE_4, 0, "above",  # by K again where the workers were meant
         (("    base_lr *= args.accumulate\n", "    base_lr *= args.accumulate ** 2\n"),)),
    Case("at-scale", "keras_sync_bn", AT_SCALE_4, 1, "horovod.tensorflow.SyncBatchNormalization",
         (("norm = SyncBatchNormalization if", "norm = tf.keras.layers.experimental.SyncBatchNormalization if"),)),
    Case("at-scale", "pure_bfloat16", AT_SCALE_4, 0, "mixed_bfloat16",
         (('set_global_policy("mixed_bfloat16" if', 'set_global_policy("bfloat16" if'),)),
    Case("at-scale", "bfloat16_output", AT_SCALE_4, 2, 'dtype="float32"', ((', dtype="float32")(x)', ")(x)"),)),
    Case("at-scale", "profile_every_rank", AT_SCALE_4, 3, "wrote a profile too",
         (("    if args.profile_dir and hvd.rank() == 0:\n", "    if args.profile_dir:\n"),)),
    Case("at-scale", "profile_never_stopped", AT_SCALE_4, 3, "wrote no profile",
         (("        tf.profiler.experimental.stop()\n", ""),)),
    Case("at-scale", "profile_validation", AT_SCALE_4, 3, "no training step", (  # validation batches, not training's
        ("def on_train_batch_begin(", "def on_test_batch_begin("),
        ("def on_train_batch_end(", "def on_test_batch_end("),
        ("first: int = 2", "first: int = 0"))),
    Case("at-scale", "profile_around_fit", AT_SCALE_4, 4, "", transform=lambda s: s.replace(  # the context manager
        "        callbacks.append(ProfileBatches(args.profile_dir))\n", "        pass\n").replace(
        "    model.fit(train_ds,", "    import contextlib\n"
        "    with (tf.profiler.experimental.Profile(args.profile_dir) if args.profile_dir and hvd.rank() == 0\n"
        "          else contextlib.nullcontext()):\n"
        "        model.fit(train_ds,").replace(
        "              validation_data=test_ds, validation_steps=validation_steps,\n"
        "              callbacks=callbacks, verbose=verbose)",
        "                  validation_data=test_ds, validation_steps=validation_steps,\n"
        "                  callbacks=callbacks, verbose=verbose)")),
    Case("at-scale", "elastic_ignored", AT_SCALE, 4, "never shrank",  # parsed, and nothing made elastic
         (("    if args.elastic:\n        # Horovod elastic: the state",
           "    if False:\n        # Horovod elastic: the state"),)),
    Case("at-scale", "elastic_epoch_not_restored", AT_SCALE, 4, "was not restored",
         (("initial_epoch=state.epoch,", "initial_epoch=resume_from_epoch,"),)),
    Case("at-scale", "elastic_resume_broadcast", AT_SCALE, 4, "runs your script from the top",  # deadlocks a newcomer
         (("    if not args.elastic:\n        resume_from_epoch = int(",
           "    if True:\n        resume_from_epoch = int("),)),
    Case("at-scale", "elastic_horovod_epochs", AT_SCALE, 5, "", (  # Horovod's example: fit for the epochs left
        ('epoch_done = tf.keras.callbacks.LambdaCallback(\n'
         '            on_epoch_end=lambda epoch, logs: setattr(state, "epoch", epoch + 1))',
         "epoch_done = hvd.elastic.UpdateEpochStateCallback(state)"),
        ("epochs=args.epochs, initial_epoch=state.epoch,", "epochs=args.epochs - state.epoch,"))),
    Case("at-scale", "elastic_epochs_counted_twice", AT_SCALE, 4, "tf.keras numbers", (
        ('epoch_done = tf.keras.callbacks.LambdaCallback(\n'
         '            on_epoch_end=lambda epoch, logs: setattr(state, "epoch", epoch + 1))',
         "epoch_done = hvd.elastic.UpdateEpochStateCallback(state)"),)),
    Case("at-scale", "elastic_broadcast_callback", AT_SCALE, 4, "BroadcastGlobalVariablesCallback",
         (("    if not args.elastic:  # Horovod elastic: state.sync()",
           "    if True:  # Horovod elastic: state.sync()"),)),
]


def find(lab: str, name: str) -> Case:
    return next(c for c in CASES if (c.lab, c.name) == (lab, name))


def record(case: Case, folder: Path, timeout: float | None = None) -> float:
    """Run ``case`` under its probe and write its evidence; the seconds it took.

    ``timeout`` (default: the lab's) gives a busy machine more time; the evidence does not depend on it.
    """
    from labkit import check
    from labkit.records.hvd_evidence import RunEvidence

    start = time.perf_counter()
    report = check.run_check(case.lab, case.script(folder), case.step, timeout, fresh=True,
                             evidence_out=case.fixture)
    ev = report.evidence
    runs = ev.runs() if isinstance(ev, RunEvidence) else []
    if (ev is not None and ev.cut_short()) or any(r.timed_out or r.interrupted for r in runs):
        print(f"(the run was cut short: record {case.name} again with a longer --timeout)", end=" ")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lab", action="append", help="only this lab (repeatable; default: all)")
    p.add_argument("--case", action="append", help="only this case (repeatable)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per check (default: the lab's)")
    a = p.parse_args(argv)
    chosen = [c for c in CASES if (not a.lab or c.lab in a.lab) and (not a.case or c.name in a.case)]
    if not chosen:
        p.error("no case matches")
    with tempfile.TemporaryDirectory(prefix="labkit-probe-cases-") as tmp:
        for i, case in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {case.lab} {case.name} ...", end=" ", flush=True)
            try:
                print(f"{record(case, Path(tmp), a.timeout):.0f} s", flush=True)
            except FileNotFoundError as e:
                print(f"skipped: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
