"""PyTorch instrumentation on top of the native collector: dataloader fetches, a module's
forward and backward, optimizer.step, and DDP allreduce latency. Works with torch >= 1.13
(Debian 12's python3-torch): only long-standing hook APIs are used."""
from rankwatch import _native

now_ns = _native.now_ns
_FORWARD, _BACKWARD = _native.PHASE_FORWARD, _native.PHASE_BACKWARD
_OPTIMIZER, _COLLECTIVE = _native.PHASE_OPTIMIZER, _native.PHASE_COLLECTIVE
_DATALOADER = _native.PHASE_DATALOADER


def timed_iter(native, iterable):
    it = iter(iterable)
    while True:
        t0 = now_ns()
        try:
            item = next(it)
        except StopIteration:
            return
        native.add_phase(_DATALOADER, t0, now_ns())
        yield item


def _first_grad_tensor(output):
    import torch
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, (list, tuple)):
        for o in output:
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    if isinstance(output, dict):
        for o in output.values():
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    return None


def instrument_module(native, module):
    """Forward: pre-hook to hook. Backward: from the moment the output's gradient arrives
    until the end of the whole backward pass. The end is an autograd-engine final callback
    queued from a final callback, so it runs after DDP's own (which waits for the allreduce),
    and the backward phase includes the gradient synchronisation, as in a plain loop timing
    loss.backward()."""
    from torch.autograd import Variable
    state = {"t0": 0}
    engine = Variable._execution_engine

    def pre_hook(mod, inputs):
        state["t0"] = now_ns()

    def hook(mod, inputs, output):
        t1 = now_ns()
        native.add_phase(_FORWARD, state["t0"], t1)
        tensor = _first_grad_tensor(output)
        if tensor is None:
            return None

        def grad_hook(grad):
            b0 = now_ns()

            def end_backward():
                native.add_phase(_BACKWARD, b0, now_ns())

            engine.queue_callback(lambda: engine.queue_callback(end_backward))
            return None

        tensor.register_hook(grad_hook)
        return None

    module.register_forward_pre_hook(pre_hook)
    module.register_forward_hook(hook)


def instrument_optimizer(native, optimizer):
    step = optimizer.step

    def timed_step(*args, **kwargs):
        t0 = now_ns()
        try:
            return step(*args, **kwargs)
        finally:
            native.add_phase(_OPTIMIZER, t0, now_ns())

    optimizer.step = timed_step


def register_timed_allreduce(native, ddp_model, process_group=None):
    import torch.distributed as dist

    def timed_allreduce(group, bucket):
        t0 = now_ns()
        world = dist.get_world_size(group)
        tensor = bucket.buffer().div_(world)
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):
            native.add_phase(_COLLECTIVE, t0, now_ns())
            return f.value()[0]

        return fut.then(done)

    ddp_model.register_comm_hook(process_group, timed_allreduce)
