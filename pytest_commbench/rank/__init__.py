"""Code that runs inside each MPI rank: set up the world, call the solution, save what it wrote.

Nothing here decides a verdict. The rank knows the inputs it was handed and where to put the
outputs; the seed, the oracle and the statistics stay in the controller (`engine/`).
"""
