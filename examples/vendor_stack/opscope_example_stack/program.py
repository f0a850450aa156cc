"""A region compiled by TorchScript; profiled per member (forward hooks on each n<i>) on opscope's clock."""
import time

import torch
from opscope.runtime.plugin import RegionProgram, example_inputs, to_torch


class Program(RegionProgram):
    def __init__(self, region, opts):
        super().__init__(region, self.call)
        self.opts, self.eager, self.spans = opts, to_torch(region), None
        traced = torch.jit.trace(self.eager, example_inputs(region), check_trace=False)
        self.compiled = torch.jit.freeze(traced) if opts["freeze"] else traced
        for name, member in self.eager.named_children():
            member.register_forward_pre_hook(lambda m, a: setattr(m, "t0", time.perf_counter_ns()))
            member.register_forward_hook(lambda m, a, o, n=name: self.spans is not None and
                                         self.spans.append((n, m.t0, time.perf_counter_ns())))

    def call(self, *inputs):
        torch.set_num_threads(self.opts["threads"])
        with torch.no_grad():      # NOTE: a profiled step runs the eager module, whose members the hooks time
            out = (self.eager if self.spans is not None else self.compiled)(*map(torch.as_tensor, inputs))
        return [o.numpy() for o in out]

    def start_profile(self):
        self.spans = []

    def stop_profile(self):
        spans, self.spans = self.spans or [], None
        return [self.child(n, "torchscript", s, e, "tsregions forward hooks") for n, s, e in spans]
