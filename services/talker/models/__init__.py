"""Pure model modules of the talker: no serving code, no checkpoint naming beyond module attribute names."""
