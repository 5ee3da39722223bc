"""A labelled corpus of agent sessions: real loops, and legitimate repetition that is not one."""
