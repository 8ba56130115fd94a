"""The round loop and what keeps a training going: a round's slots and their phases, re-sends,
reassignment of failed or slow work, deadlines and health, the elastic pool, stopping, and
``run``, which drives a funded training from its first round to its end."""
