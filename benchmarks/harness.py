"""What the benchmarks share: a sink that keeps the recorder's batches in memory (so a benchmark measures
the hooks, not the stream), and the interleaved-rounds flags of the model benchmarks."""
from __future__ import annotations


class NullSink:
    """Counts the recorder's events and keeps nothing: measures the recorder, not the stream."""

    def __init__(self):
        self.events = 0

    def send(self, batch) -> bool:
        self.events += batch.n
        return True


def add_round_arguments(ap) -> None:
    """--model, --repeat, --warmup, --threads, --quick: one timed round runs every side once."""
    ap.add_argument("--model", default="demo:gpt")
    ap.add_argument("--repeat", type=int, default=30, help="timed rounds (each round runs every side once)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: a shared machine times more stably on one)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 5 rounds, 1 warm-up")


def parse_round_arguments(ap):
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.warmup = 5, 1
    return args
