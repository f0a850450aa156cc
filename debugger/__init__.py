"""opscope.debugger: the terminal tensor debugger.

    controller   runs the model in a worker thread that pauses in the executor's hook
    breakpoints  op type / path glob / condition breakpoints
    watches      expressions over the current op's tensors, with history
    lockstep     every op also on a reference backend: total vs introduced error
    stats        cheap tensor summaries, sparklines, paged value views
    app, view    the Textual UI and the text of its panels (made in the worker thread)
    table        the tensors table: one Content per stop, a cursor for the value view
    screens      the help and advisor pop-ups
    advice       the profiler's advisor over the ops this session ran (no stored run needed)
    debugpy      --debugpy: a DAP server on 127.0.0.1 for stepping into kernels' Python
"""
