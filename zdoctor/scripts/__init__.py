"""Files zdoctor runs in another interpreter (the training environment's), never imports itself: each is
stdlib-only Python 3.8+."""
