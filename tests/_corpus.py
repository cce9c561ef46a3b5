"""The small corpus the ensemble and adapter tests share (a module of its own, so test files can import it)."""

from __future__ import annotations

TEXTS = [
    "The aurora borealis is caused by charged particles from the solar wind hitting the upper atmosphere.",
    "Northern lights glow green when oxygen atoms are excited high above the poles.",
    "Ocean tides rise and fall because of the gravitational pull of the moon.",
    "Volcanoes erupt when molten magma rises through cracks in the crust.",
    "Part number XK-4471 is a titanium bolt rated for 400 bar.",
    "Photosynthesis converts sunlight, water and carbon dioxide into sugar in plant leaves.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "A glacier is a slow river of ice that carves valleys over thousands of years.",
    "Lava that cools quickly at the surface forms basalt and obsidian.",
    "Spring tides happen when the sun and the moon line up at new and full moon.",
]
IDS = [f"doc{i}" for i in range(len(TEXTS))]
