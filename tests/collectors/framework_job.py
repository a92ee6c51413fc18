"""A real 2-stage pipeline job of a training framework, on CPU with gloo, instrumented by one
rankwatch call and nothing else in its loop (tests/collectors/test_framework_ops.py).

--framework deepspeed: DeepSpeed's PipelineModule of 4 Linear/ReLU layers split over 2 stages,
its PipelineEngine (deepspeed.initialize, DS_ACCELERATOR=cpu: gloo; DeepSpeed's optional
shared-memory all-reduce kernel is not compiled, below), --microbatches gradient
accumulation steps a batch, `engine.train_batch()` --steps times, then one `eval_batch()` (which
must record nothing); `rw.instrument_deepspeed(engine)` is the only rankwatch call besides
init() and close().

--framework megatron [--vpp 2]: Megatron-core's own pipeline schedule, from
get_forward_backward_func() after parallel_state.initialize_model_parallel(pipeline size 2, and
2 model chunks a stage with --vpp 2: the interleaved schedule) over the gloo world, called as its
examples do (forward_step_func, data iterators, model chunks, num_microbatches) --steps times
with a plain SGD step after each, then once forward_only (evaluation, which must record
nothing). Its P2PCommunicator, forward_step and backward_step are Megatron's, unchanged. The
only rankwatch call is init() (after megatron.core is imported and model parallelism
initialised) and close(): the layout, the instrumentation and the steps are found alone.
Megatron-core assumes a CUDA device in two places, which this job points at the CPU (test
shims, nothing else is changed): `torch.cuda.current_device()` (where p2p_communication.py
allocates its receive buffers) answers "cpu", and a TorchFunctionMode makes the schedule's
`torch.zeros([], device="cuda")` token counter on the CPU. The p2p calls then run Megatron's
own isend/irecv path (batch_p2p_comm=False) on gloo.

Started one process per rank as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
prints one JSON line."""
import argparse
import json
import os
import sys
import time


def deepspeed_job(args, rw):
    import torch
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.utils import RepeatingLoader

    import deepspeed.ops
    # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce kernel (g++, ~50 s on
    # the 2-core VM) at its first init unless told the op is not compatible; gloo's all-reduce
    # serves instead. Nothing of the pipeline changes.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")  # over the gloo world main() made
    torch.manual_seed(0)
    width, micro = 16, 2
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": args.microbatches,
              "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    rw.instrument_deepspeed(engine)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(micro, width, generator=g), torch.randn(micro, width, generator=g)) for _ in range(8)]
    it = iter(RepeatingLoader(data))
    losses = []
    for _ in range(args.steps):
        losses.append(float(engine.train_batch(data_iter=it)))
    ops_before_eval = rw.stats()["ops_recorded"]
    engine.eval_batch(iter(RepeatingLoader(data)))
    return {"stage": engine.stage_id, "losses": losses, "layout_source": rw.layout_source,
            "ops_recorded_by_eval": rw.stats()["ops_recorded"] - ops_before_eval}


def megatron_job(args, init_rankwatch):
    import torch
    from torch.overrides import TorchFunctionMode
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    class CudaOnCpu(TorchFunctionMode):
        """Test shim: a factory call asking for device "cuda" makes its tensor on the CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if kwargs.get("device") == "cuda":
                kwargs = dict(kwargs, device="cpu")
            return func(*args, **kwargs)

    torch.cuda.current_device = lambda: "cpu"  # test shim (see the module's docstring)
    vpp = args.vpp if args.vpp > 1 else None
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2,
                                             virtual_pipeline_model_parallel_size=vpp)
    rw = init_rankwatch()  # after Megatron: finds its layout and instruments its config.timers
    hidden, seq, micro = 16, 8, 2
    chunks = args.vpp
    config = TransformerConfig(num_layers=2 * chunks, hidden_size=hidden, num_attention_heads=1,
                               pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=vpp,
                               pipeline_dtype=torch.float32, batch_p2p_comm=False,
                               use_cpu_initialization=True)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(stage)

    class Chunk(torch.nn.Module):
        """One model chunk of this stage: a Linear layer; the first chunk of stage 0 reads the
        microbatch, the others the tensor the schedule received (set_input_tensor)."""

        def __init__(self, chunk):
            super().__init__()
            self.config, self.vp_stage, self.model_type = config, chunk, ModelType.encoder_or_decoder
            self.reads_data = stage == 0 and chunk == 0
            self.linear = torch.nn.Linear(hidden, hidden)
            self.input_tensor = None

        def set_input_tensor(self, tensor):
            self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

        def forward(self, x):
            return torch.tanh(self.linear(x if self.reads_data else self.input_tensor))

    model = [Chunk(c) for c in range(chunks)]
    optimizer = torch.optim.SGD([p for m in model for p in m.parameters()], lr=0.01)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(seq, micro, hidden, generator=g), torch.randn(seq, micro, hidden, generator=g))
               for _ in range(args.microbatches)]

    def forward_step_func(data_iterator, chunk):
        x, y = next(data_iterator)

        def loss_func(output):
            loss = ((output - y) ** 2).mean()
            return loss, {"loss": loss.detach()}
        return chunk(x), loss_func

    forward_backward = get_forward_backward_func()
    losses = []
    for step in range(args.steps + 1):
        evaluation = step == args.steps
        with CudaOnCpu():
            out = forward_backward(forward_step_func=forward_step_func,
                                   data_iterator=[iter(batches) for _ in model] if chunks > 1 else iter(batches),
                                   model=model if chunks > 1 else model[0], num_microbatches=args.microbatches,
                                   seq_length=seq, micro_batch_size=micro, forward_only=evaluation)
        if not evaluation:
            optimizer.step()
            optimizer.zero_grad()
            losses.append([float(d["loss"]) for d in out])
    return rw, {"stage": stage, "losses": losses, "layout_source": rw.layout_source,
                "layout": rw.layout.as_dict() if rw.layout is not None else None,
                "schedule": forward_backward.__name__, "steps_recorded": rw.stats()["steps_recorded"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--framework", choices=("deepspeed", "megatron"), required=True)
    p.add_argument("--vpp", type=int, default=1, help="Megatron: model chunks a stage (2: interleaved)")
    args = p.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch.distributed as dist
    dist.init_process_group("gloo")
    import rankwatch

    def init_rankwatch():
        return rankwatch.init(job=args.job, brokers=args.brokers, flush_interval_ms=100, watch_gc=False)
    t0 = time.monotonic()
    if args.framework == "megatron":
        rw, result = megatron_job(args, init_rankwatch)
    else:
        rw = init_rankwatch()
        result = deepspeed_job(args, rw)
    result.update(rank=dist.get_rank(), seconds=round(time.monotonic() - t0, 2),
                  delivered=rw.flush(timeout_s=20))
    rw.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
