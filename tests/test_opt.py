"""Training with ggml-opt from Python (pyggml.opt): a real classifier on scikit-learn's
8x8 digits, and every argument ggml-opt would abort on refused first."""

import math

import numpy as np
import pytest

import pyggml
from pyggml import Type, opt
from pyggml.errors import ArgumentError, ContextClosedError, GGMLAbort

BATCH = 50


def _digits():
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    return (d.data[order] / 16.0).astype(np.float32), np.eye(10, dtype=np.float32)[d.target[order]]


def _model(cpu, seed=0, compute_mem=64 << 20, batch=BATCH):
    rng = np.random.default_rng(seed)
    weights = pyggml.Context(1 << 20, no_alloc=True)
    w1 = weights.new_tensor(Type.F32, (64, 32))
    b1 = weights.new_tensor(Type.F32, (32,))
    w2 = weights.new_tensor(Type.F32, (32, 10))
    b2 = weights.new_tensor(Type.F32, (10,))
    images = weights.new_tensor(Type.F32, (64, batch))
    for p in (w1, b1, w2, b2):
        pyggml.set_param(p)
    cpu.alloc_ctx_tensors(weights)
    w1.set((rng.standard_normal((32, 64)) / 8).astype(np.float32))
    w2.set((rng.standard_normal((10, 32)) / np.sqrt(32)).astype(np.float32))
    b1.set(np.zeros(32, np.float32))
    b2.set(np.zeros(10, np.float32))
    compute = pyggml.Context(compute_mem, no_alloc=True)
    hidden = pyggml.relu(compute, pyggml.add(compute, pyggml.mul_mat(compute, w1, images), b1))
    logits = pyggml.add(compute, pyggml.mul_mat(compute, w2, hidden), b2)
    return weights, compute, images, logits


def _dataset(x, y):
    d = opt.Dataset(len(x), x.shape[1], y.shape[1])
    d.data[...] = x
    d.labels[...] = y
    return d


@pytest.mark.parametrize("optimizer, params, want", [("adamw", {"alpha": 3e-3}, 0.93), ("sgd", {"alpha": 0.3}, 0.85)])
def test_a_classifier_learns_the_digits(optimizer, params, want):
    x, y = _digits()
    cpu = pyggml.Backend("CPU")
    sched = opt.Scheduler([cpu])
    weights, compute, images, logits = _model(cpu)
    trainer = opt.Optimizer(sched, compute, images, logits, loss="cross_entropy", optimizer=optimizer)
    held_out = _dataset(x[1500:1750], y[1500:1750])
    _, before = trainer.epoch(held_out, 0)               # evaluation only
    assert before.ndata == 250 and before.accuracy < 0.3          # untrained: about chance (0.1)
    seen = []
    history = opt.fit(trainer, _dataset(x[:1500], y[:1500]), nepoch=20, val_split=0.2, params=params,
                      callback=lambda train, i, n, r: seen.append((train, i, n)))
    assert len(history) == 20 and history[0].params == params
    losses = [e.train.loss for e in history]
    assert losses[-1] < 0.5 * losses[0] and all(math.isfinite(v) for v in losses)
    assert history[-1].val.ndata == 300 and history[-1].train.ndata == 1200
    assert seen.count((True, 24, 24)) == 20 and seen.count((False, 6, 6)) == 20     # 24 + 6 batches per epoch
    _, after = trainer.epoch(held_out, 0)
    assert after.accuracy > want                         # what no untrained model reaches
    assert np.mean(after.pred == y[1500:1750].argmax(1)) == pytest.approx(after.accuracy)


def test_optimizer_parameters_per_epoch_from_a_callable():
    x, y = _digits()
    cpu = pyggml.Backend()
    weights, compute, images, logits = _model(cpu)
    trainer = opt.Optimizer(opt.Scheduler([cpu]), compute, images, logits)
    history = opt.fit(trainer, _dataset(x[:500], y[:500]), nepoch=3, params=lambda e: {"alpha": 1e-3 * e})
    assert [h.params["alpha"] for h in history] == pytest.approx([1e-3, 2e-3, 3e-3])
    for bad, match in (({"alpha": 0.0}, "alpha must be > 0"), ({"alpha": float("nan")}, "alpha"),
                       ({"wd": 2}, "wd must be in"), ({"beta1": -1}, "beta1"), ({"lr": 1}, "has no lr"),
                       ({"alpha": "fast"}, "must be a number")):
        with pytest.raises(ArgumentError, match=match):
            trainer.epoch(_dataset(x[:100], y[:100]), params=bad)


def test_a_callback_error_is_raised_after_the_epoch():
    x, y = _digits()
    cpu = pyggml.Backend()
    weights, compute, images, logits = _model(cpu)
    trainer = opt.Optimizer(opt.Scheduler([cpu]), compute, images, logits)

    def boom(train, i, n, r):
        raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        trainer.epoch(_dataset(x[:100], y[:100]), callback=boom)
    train, _ = trainer.epoch(_dataset(x[:100], y[:100]))      # still usable
    assert train.ndata == 100


def test_what_ggml_opt_would_abort_on_is_refused():
    cpu = pyggml.Backend()
    with pytest.raises(ArgumentError, match="non-empty list"):
        opt.Scheduler([])
    with pytest.raises(ArgumentError, match="twice"):
        opt.Scheduler([cpu, cpu])
    with pytest.raises(ArgumentError, match="graph_size"):
        opt.Scheduler([cpu], graph_size=0)
    for kw, match in ((dict(ndata=0, ne_datapoint=4), "ndata"), (dict(ndata=10, ne_datapoint=4, ndata_shard=3),
                                                                 "multiple of ndata_shard"),
                      (dict(ndata=10, ne_datapoint=4, type_data=Type.Q4_0), "type_data")):
        with pytest.raises(ArgumentError, match=match):
            opt.Dataset(**kw)
    sched = opt.Scheduler([cpu])
    with pytest.raises(pyggml.InUseError, match="a Scheduler uses it"):
        cpu.close()
    weights, compute, images, logits = _model(cpu)
    with pytest.raises(ArgumentError, match="loss must be one of"):
        opt.Optimizer(sched, compute, images, logits, loss="hinge")
    with pytest.raises(ArgumentError, match="optimizer must be one of"):
        opt.Optimizer(sched, compute, images, logits, optimizer="lbfgs")
    with pytest.raises(ArgumentError, match="outputs must be an F32"):
        opt.Optimizer(sched, compute, images, pyggml.transpose(compute, logits))
    na = pyggml.Context(1 << 20, no_alloc=True)
    unallocated = na.new_tensor(Type.F32, (64, BATCH))
    with pytest.raises(ArgumentError, match="inputs must be allocated"):
        opt.Optimizer(sched, compute, unallocated, logits)
    plain = pyggml.Context(1 << 20)
    fixed = plain.from_numpy(np.ones((10, 64), np.float32))           # no parameter anywhere
    x_in = plain.from_numpy(np.ones((BATCH, 64), np.float32))
    with pytest.raises(ArgumentError, match="no parameter"):
        opt.Optimizer(sched, pyggml.Context(8 << 20, no_alloc=True), x_in,
                      pyggml.mul_mat(plain, fixed, x_in))
    # too little room for ggml-opt's graphs: its abort, proven in a forked child
    w2, small, im2, lg2 = _model(cpu, compute_mem=96 << 10)
    with pytest.raises(GGMLAbort, match=r"^Optimizer \(ggml-opt\): ggml would abort \(signal \d+\): .*not enough space"):
        opt.Optimizer(sched, small, im2, lg2)
    trainer = opt.Optimizer(sched, compute, images, logits)
    bad_points = opt.Dataset(100, 32, 10)
    with pytest.raises(ArgumentError, match="do not fit the inputs"):
        trainer.epoch(bad_points)
    with pytest.raises(ArgumentError, match="needs F32 labels of 10"):
        trainer.epoch(opt.Dataset(100, 64, 3))
    with pytest.raises(ArgumentError, match="multiple of the batch"):
        trainer.epoch(opt.Dataset(120, 64, 10))
    with pytest.raises(ArgumentError, match="idata_split"):
        trainer.epoch(opt.Dataset(100, 64, 10), idata_split=30)
    with pytest.raises(ArgumentError, match="idata"):
        trainer.shuffle(opt.Dataset(100, 64, 10), 101)
    compute.close()
    with pytest.raises(ContextClosedError):
        trainer.epoch(opt.Dataset(100, 64, 10))


def test_index_ops_are_refused_in_a_trained_graph():
    cpu = pyggml.Backend()
    weights = pyggml.Context(1 << 20, no_alloc=True)
    table = weights.new_tensor(Type.F32, (8, 16))
    ids = weights.new_tensor(Type.I32, (BATCH,))
    pyggml.set_param(table)
    cpu.alloc_ctx_tensors(weights)
    compute = pyggml.Context(16 << 20, no_alloc=True)
    rows = pyggml.get_rows(compute, table, ids)
    with pytest.raises(ArgumentError, match="reads positions"):
        opt.Optimizer(opt.Scheduler([cpu]), compute, pyggml.reshape_2d(compute, ids, 1, BATCH), rows)


def test_the_optimizers_proof_keeps_the_process_time_limit():
    """ggml-opt's forked dry run (ggml_opt_init, an allocation and one batch) is a proof
    like Graph.compute's: it keeps set_proof_timeout's limit."""
    import time
    cpu = pyggml.Backend()
    sched = opt.Scheduler([cpu])
    weights, compute, images, logits = _model(cpu, batch=50_000)       # a batch of ~0.3 GFLOP
    was = pyggml.set_proof_timeout(0.001)
    try:
        t0 = time.monotonic()
        with pytest.raises(pyggml.KernelTimeout, match=r"did not finish in the proof's 0\.001 s"):
            opt.Optimizer(sched, compute, images, logits)
        assert time.monotonic() - t0 < 10
    finally:
        pyggml.set_proof_timeout(was)
    opt.Optimizer(sched, compute, images, logits)                   # the same, with the limit back
