"""`multirank-logger ui`: a live page over a store (runs, a run's findings, band charts and
rank x step heatmaps, compare two runs), served by the package alone; and the same views as
one self-contained HTML file (``report -o FILE.html``)."""
