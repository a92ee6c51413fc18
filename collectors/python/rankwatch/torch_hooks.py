"""PyTorch instrumentation on top of the native collector: dataloader fetches, a module's
forward and backward, optimizer.step, and DDP's gradient synchronisation. Works with torch >= 1.13
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


def instrument_module(native, module, compute=False, sync=False):
    """Hooks `module` once; later calls only add what they ask for.

    compute: forward (pre-hook to hook) and backward, from the moment the output's gradient
    arrives until the end of the whole backward pass, DDP's gradient synchronisation included
    (as a plain loop timing loss.backward()).
    sync: the collective phase, the part of backward spent waiting for the gradient allreduce
    after the local backward computation ended (the exposed synchronisation, where waiting for
    slower ranks shows).

    Both ends are autograd-engine final callbacks queued when the output's gradient arrives:
    the first runs when the backward graph has been computed, before DDP's own (which waits
    for the allreduce); it queues the second, which runs after DDP's. No comm hook and no
    per-parameter hook is needed: two Python callbacks per step."""
    from torch.autograd import Variable
    state = getattr(module, "_rankwatch_hooks", None)
    if state is not None:
        state["compute"] = state["compute"] or compute
        state["sync"] = state["sync"] or sync
        return
    state = {"t0": 0, "compute": compute, "sync": sync}
    module._rankwatch_hooks = state
    engine = Variable._execution_engine

    def pre_hook(mod, inputs):
        state["t0"] = now_ns()

    def hook(mod, inputs, output):
        t1 = now_ns()
        if state["compute"]:
            native.add_phase(_FORWARD, state["t0"], t1)
        tensor = _first_grad_tensor(output)
        if tensor is None:
            return None

        def grad_hook(grad):
            b0 = now_ns()
            computed = [0]

            def end_backward():
                t = now_ns()
                if state["compute"]:
                    native.add_phase(_BACKWARD, b0, t)
                if state["sync"]:
                    native.add_phase(_COLLECTIVE, computed[0], t)

            def graph_computed():
                computed[0] = now_ns()
                engine.queue_callback(end_backward)

            engine.queue_callback(graph_computed)
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
    """A DDP comm hook (allreduce, averaging) timing each bucket's allreduce, waiting included.
    Costs ~140 us a step (the hook and its completion callback run in Python)."""
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
