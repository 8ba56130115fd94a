"""Checking a result before it is folded or paid: what it looked like on arrival (a list of
``ResultCheck``s), the work checks (commitments, lower bounds, copies; pure), spot checks that
re-execute committed segments, and the hardware challenge at discovery."""
