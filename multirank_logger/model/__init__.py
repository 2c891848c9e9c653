"""Pure data, no engine and no I/O: the store's schema, the Arrow batch of metric rows, CSVLogger's
layout rebuilt from long rows, the wire format shared by the channel and spill files, side-table rows."""
