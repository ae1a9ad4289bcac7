"""The one write road: due jobs become run rows, one statement a batch."""
