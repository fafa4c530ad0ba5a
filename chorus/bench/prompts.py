"""The bundled prompts: short, medium and long English texts (one sentence each for fixed-length runs, since
`ignore_eos` applies per sentence segment), and text-to-audio prompts."""

SPEECH = {
    "short": "Hello, and welcome to the show.",
    "medium": "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of the old house.",
    "long": (
        "In the early morning light the harbour came slowly to life, with fishing boats returning from the night "
        "and gulls circling above the market stalls where traders set out crates of silver fish and fresh bread."
    ),
}

AUDIO = ("rain on a tin roof", "a busy cafe with soft jazz", "ocean waves at night", "birdsong in a spring forest")
