"""A network MindSpore 2.10 cannot convert to ONNX (no conversion for Cummax). At module level because
graph mode parses a Cell's source, which fails for a class nested in a function."""

from mindspore import nn, ops


class RunningMax(nn.Cell):
    def construct(self, x):
        return ops.cummax(x, 1)[0]
