"""The main job: a crash-proof agent fleet replaying real (or generated) agent runs under SIGKILL chaos."""
