"""The launch of a training job: which launcher a command line uses and with which options, the environment
each rank needs from it, and the CPUs each rank may run on."""
