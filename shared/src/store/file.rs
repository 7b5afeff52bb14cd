//! The embedded [`Store`]: one directory on the local file system.
//!
//! Each key is a file below the root (`topics/t/0/manifest.json` is
//! `ROOT/topics/t/0/manifest.json`). A write goes to a temporary file beside its key
//! (`.tmp-` and a name unique across processes, in the key's directory), is flushed with
//! `fsync`, and is renamed into place, so a reader sees either the old or the new content,
//! never a torn file.
//! The rename never leaves its directory, and a directory that holds a writer's temporary
//! file is never tidied away under it.
//!
//! A conditional write holds an exclusive `flock` on its key's lock stripe
//! (`ROOT/.tmp/lock-NN`, one of [`STRIPES`] by a hash of the key) while it checks and
//! renames, so the compare-and-swap is safe between tasks of one process and between
//! processes that share the directory (on one machine; not over NFS), and writes to
//! independent keys (partitions) run side by side. Their data is written and flushed
//! before the lock is taken, so the lock covers the check, the rename and the directory's
//! `fsync`, and concurrent `fsync`s are grouped by the file system. Every writer also
//! holds `ROOT/.lock` shared: builds before stripes took it exclusively, so a process of
//! such a build still excludes every writer while it writes. Reads take no lock.
//!
//! ETags are content hashes (like S3's MD5 ETags): equal bytes give equal ETags.
//!
//! The store holds the receipt-signing key and every payload, so it is private to the
//! user running Narad: directories are created 0700 and files 0600 (on Unix), and opening
//! a store makes its root 0700 (which also closes off files an older version left 0644).

use std::fs::{self, File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;

use super::{content_etag, ETag, Failure, Listed, Object, Store, StoreError, StoreResult};

const LOCK_FILE: &str = ".lock";
const TMP_DIR: &str = ".tmp";
/// A temporary file's name starts with this (reserved: no key component may).
const TMP_PREFIX: &str = ".tmp-";
/// Lock stripes: two keys share one with probability 1/64.
pub const STRIPES: usize = 64;
/// Attempts at placing a temporary file, when a delete removes its emptied directory
/// between the directory's creation and the file's.
const PLACE_ATTEMPTS: usize = 8;

/// A store rooted at one directory.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: Arc<PathBuf>,
    locks: Arc<Locks>,
}

impl FileStore {
    /// Opens (creating if needed) the store at `path`.
    ///
    /// Errors: [`StoreError::Other`] when the directory cannot be created or written.
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        let root = path.as_ref().to_path_buf();
        let r = root.clone();
        let locks = blocking(move || {
            create_dirs(&r.join(TMP_DIR))?;
            private(&r)?;
            Locks::open(&r)
        })
        .await
        .map_err(|e| {
            let what = format!("cannot open file store at {}: {e}", root.display());
            StoreError::Other(Failure::caused_by(what, e))
        })?;
        Ok(Self {
            root: Arc::new(root),
            locks: Arc::new(locks),
        })
    }

    fn path_of(&self, key: &str) -> StoreResult<PathBuf> {
        let valid = !key.is_empty()
            && !key.starts_with('/')
            && key
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !reserved(c));
        if !valid {
            return Err(StoreError::other(format!("invalid key {key:?}")));
        }
        Ok(self.root.join(key))
    }

    async fn conditional_put(&self, key: &str, data: Bytes, cond: Condition) -> StoreResult<ETag> {
        let path = self.path_of(key)?;
        let (root, locks, key) = (self.root.clone(), self.locks.clone(), key.to_owned());
        blocking(move || {
            let tmp = write_tmp(&root, &path, &data)?;
            let etag = content_etag(&data);
            let put = (|| {
                let _lock = locks.key(&key)?;
                let current = read_opt(&path)?;
                match (&cond, current) {
                    (Condition::Absent, Some(_)) => return Ok(Err(StoreError::Conflict)),
                    (Condition::Absent, None) => {}
                    (Condition::Match(_), None) => return Ok(Err(StoreError::NotFound)),
                    (Condition::Match(want), Some(cur)) => {
                        if content_etag(&cur) != *want {
                            return Ok(Err(StoreError::Conflict));
                        }
                    }
                }
                fs::rename(&tmp, &path)?;
                if let Some(dir) = path.parent() {
                    sync_dir(dir);
                }
                Ok(Ok(etag))
            })();
            if !matches!(put, Ok(Ok(_))) {
                let _ = fs::remove_file(&tmp);
            }
            put
        })
        .await
        .map_err(io_err)?
    }
}

enum Condition {
    Absent,
    Match(ETag),
}

/// The store's locks: `ROOT/.lock`, held shared by every write of this build (and
/// exclusively by builds before stripes), and the stripes, each an in-process mutex over
/// an open lock file that is `flock`ed exclusively under it (two threads must not share
/// one open file's `flock`, which is the open file's and not the thread's).
#[derive(Debug)]
struct Locks {
    store: PathBuf,
    stripes: Vec<Mutex<File>>,
}

impl Locks {
    fn open(root: &Path) -> io::Result<Self> {
        let store = root.join(LOCK_FILE);
        lock_file(&store)?;
        let stripes = (0..STRIPES)
            .map(|i| lock_file(&root.join(TMP_DIR).join(format!("lock-{i:02}"))).map(Mutex::new))
            .collect::<io::Result<_>>()?;
        Ok(Self { store, stripes })
    }

    /// Holds `key`'s stripe, and the store lock shared, until dropped.
    fn key(&self, key: &str) -> io::Result<KeyLock<'_>> {
        let store = lock_file(&self.store)?;
        store.lock_shared()?;
        let stripe = self.stripes[stripe_of(key)]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        stripe.lock()?;
        Ok(KeyLock {
            stripe,
            _store: store,
        })
    }
}

/// Which of the [`STRIPES`] guards `key`.
fn stripe_of(key: &str) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % STRIPES as u64) as usize
}

fn lock_file(path: &Path) -> io::Result<File> {
    private_file()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// A key's stripe and the shared store lock; the stripe is released first, and the
/// store lock when its file closes.
struct KeyLock<'a> {
    stripe: MutexGuard<'a, File>,
    _store: File,
}

impl Drop for KeyLock<'_> {
    fn drop(&mut self) {
        let _ = self.stripe.unlock();
    }
}

fn read_opt(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::IsADirectory => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `data` to a new temporary file in `path`'s directory (created if needed) and
/// flushes it; the caller renames it into place or removes it.
fn write_tmp(root: &Path, path: &Path, data: &[u8]) -> io::Result<PathBuf> {
    let parent = path.parent().unwrap_or(root);
    let tmp = parent.join(format!(
        "{TMP_PREFIX}{}",
        crate::clock::process_unique_hex()
    ));
    let mut attempt = 0;
    let mut f = loop {
        // The directory usually exists: make it only when the file cannot be made without.
        let placed = match private_file().write(true).create_new(true).open(&tmp) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_dirs(parent)
                .and_then(|()| private_file().write(true).create_new(true).open(&tmp)),
            placed => placed,
        };
        match placed {
            Ok(f) => break f,
            // A delete tidied the emptied directory away in between: make it again. (The
            // standard library's recursive create answers "exists" when another writer
            // made the directory and a delete removed it before it could check.)
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::AlreadyExists
                ) && attempt + 1 < PLACE_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let written = f.write_all(data).and_then(|()| f.sync_data());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// Flushes a directory's entries (a rename into it); best effort, as not every file
/// system lets a directory be opened for it.
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Open options for a file only its owner may read or write.
fn private_file() -> OpenOptions {
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut o = OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o
}

/// Creates `dir` and its missing parents, each only its owner may enter.
fn create_dirs(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

/// Makes `dir` private to its owner (0700).
fn private(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if reserved(&name) {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            let key: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(key.join("/"));
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("file store task failed: {e}")))?
}

/// The names of `dir`'s entries that `keep` accepts, leaving out the store's own
/// `.tmp*` and lock files; none when `dir` does not exist.
fn entries_of(
    dir: &Path,
    keep: impl Fn(&fs::DirEntry) -> io::Result<bool>,
) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !reserved(&name) && keep(&entry)? {
            names.push(name);
        }
    }
    Ok(names)
}

/// Whether a directory entry is the store's own (a temporary file, the lock or the
/// locks' directory) rather than a key's.
fn reserved(name: &str) -> bool {
    name.starts_with(".tmp") || name == LOCK_FILE
}

fn io_err(e: io::Error) -> StoreError {
    StoreError::Other(Failure::caused_by(format!("file store: {e}"), e))
}

#[async_trait]
impl Store for FileStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        let path = self.path_of(key)?;
        let data = blocking(move || read_opt(&path)).await.map_err(io_err)?;
        Ok(data.map(|d| {
            let etag = content_etag(&d);
            Object {
                data: Bytes::from(d),
                etag,
            }
        }))
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.conditional_put(key, data, Condition::Absent).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.conditional_put(key, data, Condition::Match(etag.clone()))
            .await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let path = self.path_of(key)?;
        let (root, locks, key) = (self.root.clone(), self.locks.clone(), key.to_owned());
        blocking(move || {
            {
                let _lock = locks.key(&key)?;
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            // Tidy now-empty directories up to the root; a non-empty one stops the walk.
            // A writer's temporary file keeps its directory; one that finds its directory
            // gone before its file is made makes it again (`write_tmp`).
            let mut dir = path.parent();
            while let Some(d) = dir {
                if d == root.as_path() || fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
            Ok(())
        })
        .await
        .map_err(io_err)
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        blocking(move || {
            let dir_part = match prefix.rfind('/') {
                Some(i) => &prefix[..i],
                None => "",
            };
            let start = if dir_part.is_empty() {
                root.to_path_buf()
            } else {
                root.join(dir_part)
            };
            let mut out = Vec::new();
            walk(&root, &start, &mut out)?;
            out.retain(|k| k.starts_with(&prefix));
            out.sort();
            Ok(out)
        })
        .await
        .map_err(io_err)
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let dir = self.root.join(prefix.trim_end_matches('/'));
        let after = after.to_owned();
        blocking(move || {
            // A directory whose objects were all deleted holds no key.
            let names = entries_of(
                &dir,
                |e| Ok(e.file_type()?.is_dir() && has_file(&e.path())?),
            )?;
            Ok(super::dir_page(names, &after, max))
        })
        .await
        .map_err(io_err)
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let dir = self.root.join(prefix.trim_end_matches('/'));
        let prefix = prefix.to_owned();
        blocking(move || {
            let mut names = entries_of(&dir, |e| Ok(e.file_type()?.is_file()))?;
            names.sort();
            names.truncate(super::MAX_LISTED_FILES);
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                // Deleted between the listing and the read: not listed, as on S3.
                if let Some(data) = read_opt(&dir.join(&name))? {
                    out.push(Listed {
                        key: format!("{prefix}{name}"),
                        etag: content_etag(&data),
                    });
                }
            }
            Ok(out)
        })
        .await
        .map_err(io_err)
    }

    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }
}

/// Whether any file lies below `dir` (stops at the first).
fn has_file(dir: &Path) -> io::Result<bool> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if reserved(&entry.file_name().to_string_lossy()) {
            continue;
        }
        if !entry.file_type()?.is_dir() || has_file(&entry.path())? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(super::FileStore::open(dir.path()).await.unwrap());
        crate::store::testing::conformance::run_all(store, "t").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_handles_on_one_directory_share_cas() {
        // Two FileStore values on one directory behave like two processes.
        let dir = tempfile::tempdir().unwrap();
        let a = super::FileStore::open(dir.path()).await.unwrap();
        let b = super::FileStore::open(dir.path()).await.unwrap();
        use crate::store::{Store, StoreError};
        let e = a
            .put_if_absent("k", bytes::Bytes::from_static(b"1"))
            .await
            .unwrap();
        b.put_if_match("k", bytes::Bytes::from_static(b"2"), &e)
            .await
            .unwrap();
        let r = a
            .put_if_match("k", bytes::Bytes::from_static(b"3"), &e)
            .await;
        assert!(matches!(r, Err(StoreError::Conflict)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_build_holding_the_store_lock_keeps_every_writer_out() {
        // Builds before lock stripes take ROOT/.lock exclusively for each write.
        use crate::store::Store;
        let dir = tempfile::tempdir().unwrap();
        let s = super::FileStore::open(dir.path()).await.unwrap();
        let old = std::fs::File::open(dir.path().join(".lock")).unwrap();
        old.lock().unwrap();
        let put = tokio::spawn({
            let s = s.clone();
            async move {
                s.put_if_absent("a/k", bytes::Bytes::from_static(b"1"))
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            !put.is_finished(),
            "a write went ahead under an old build's lock"
        );
        old.unlock().unwrap();
        put.await.unwrap().unwrap();
        assert!(s.get("a/k").await.unwrap().is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writes_beside_deletes_in_one_directory_never_fail() {
        // A delete removes its emptied directory; a write into it at the same moment
        // makes it again instead of failing.
        use crate::store::Store;
        let dir = tempfile::tempdir().unwrap();
        let s = super::FileStore::open(dir.path()).await.unwrap();
        let mut tasks = Vec::new();
        for w in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..300 {
                    let key = format!("d/e/k{w}-{i}");
                    s.put_if_absent(&key, bytes::Bytes::from_static(b"x"))
                        .await
                        .unwrap();
                    s.delete(&key).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(s.list("d/").await.unwrap().is_empty());
        assert!(s.list_dirs("", "", 10).await.unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn leftover_temporary_files_are_no_keys() {
        // A writer that died between its temporary file and the rename leaves the file.
        use crate::store::Store;
        let dir = tempfile::tempdir().unwrap();
        let s = super::FileStore::open(dir.path()).await.unwrap();
        std::fs::create_dir_all(dir.path().join("t/0")).unwrap();
        std::fs::write(dir.path().join("t/0/.tmp-dead"), b"x").unwrap();
        assert!(s.list("t/").await.unwrap().is_empty());
        assert!(s.list_files("t/0/").await.unwrap().is_empty());
        assert!(s.list_dirs("", "", 10).await.unwrap().is_empty());
        s.put_if_absent("t/0/m", bytes::Bytes::from_static(b"1"))
            .await
            .unwrap();
        assert_eq!(s.list("t/").await.unwrap(), vec!["t/0/m".to_owned()]);
    }

    #[test]
    fn keys_spread_over_the_stripes() {
        let used: std::collections::HashSet<usize> = (0..64)
            .map(|p| super::stripe_of(&format!("topics/t/{p}/manifest.json")))
            .collect();
        assert!(used.len() > 32, "{} stripes for 64 partitions", used.len());
    }

    #[tokio::test]
    async fn rejects_path_traversal() {
        let dir = tempfile::tempdir().unwrap();
        let s = super::FileStore::open(dir.path()).await.unwrap();
        use crate::store::Store;
        assert!(s.get("../etc/passwd").await.is_err());
        assert!(s.get("/abs").await.is_err());
        assert!(s.get("a//b").await.is_err());
    }
}
