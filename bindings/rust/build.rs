// build.rs - links libgptoss.so. The directory comes from $GPTOSS_LIB_DIR, else from the
// directory of $GPTOSS_LIBRARY (the path ctest passes), else the linker's default search path.
// An rpath to that directory is added for this crate's own tests and examples, so they run
// without LD_LIBRARY_PATH; a dependent binary sets its own rpath or LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=GPTOSS_LIB_DIR");
    println!("cargo:rerun-if-env-changed=GPTOSS_LIBRARY");
    let dir = env::var_os("GPTOSS_LIB_DIR")
        .map(PathBuf::from)
        .or_else(|| env::var_os("GPTOSS_LIBRARY").and_then(|lib| PathBuf::from(lib).parent().map(PathBuf::from)));
    if let Some(dir) = dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=gptoss");
}
