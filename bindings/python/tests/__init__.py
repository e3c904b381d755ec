# Tests of the gptoss Python binding (see test_gptoss.py).
