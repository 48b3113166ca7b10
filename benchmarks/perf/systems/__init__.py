"""Scripts run in a system's own interpreter (no import of fedlightning outside ``fl_timer``)."""
