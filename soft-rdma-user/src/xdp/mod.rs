//! Loading the XDP program and maintaining its maps (the AF_XDP transport comes later).
