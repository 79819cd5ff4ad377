//! The server of `mcp-persist`'s README, as a user pastes it: the code below
//! is the README's, extracted by the build script.

include!(concat!(env!("OUT_DIR"), "/server.rs"));
