"""Training: a whole step (forward, loss, backward, optimizer) as one opscope graph."""
