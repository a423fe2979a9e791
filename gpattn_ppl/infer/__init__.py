"""The Pyro program: model / guide, ELBO, trainer, schedules, prediction, checkpoints."""
