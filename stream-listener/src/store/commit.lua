-- Commits a change under the store revision compare-and-set: the metadata header, the member records that
-- changed or went, leases, audit events, all or nothing. Only what changed is sent: the cost of a commit
-- grows with the change, not with the group.
-- KEYS: meta, rev, leases, audit, projection (schema version 1's; deleted), inbox, members, reply key*n
-- ARGV: expected revision, now the core used, header (empty: leases only, keep it and the revision), audit max length,
--       member records the caller's snapshot saw (-1: replace the whole hash, e.g. after a loss or an upgrade),
--       n checks, (memberId, lease the core used)*n   -- members it removed: their lease must be unchanged
--       n leases, (memberId, lease)*n                 -- leases that moved (only ever moved forward)
--       n removed, memberId*n                         -- leases of members that are gone
--       n records, (memberId, record JSON)*n          -- member records that changed (all of them: replace)
--       n gone, memberId*n                            -- member records to delete
--       n events, event*n
--       entries taken from the head of the inbox, answer ttl ms, n answers, answer JSON*n (to KEYS[8..]),
--       wake channel, wake payload (memberIds separated by spaces; empty: publish nothing)
-- This layout is built in one place, `CommitArgs` in store/scripts.rs (its test reads ARGV back the way
-- this script walks it): change both together.
-- Returns {1, now, new revision} or {0, now} on conflict. Queued heartbeats are answered only here, after
-- the commit that applied them, so a sender never sees a response that was not persisted.
-- The revision is max(previous + 1, now * 1000): it never repeats, even after the store lost the revision
-- key or rolled back to an older one (a failover), so a process caching an old snapshot can never match it.
-- The member records sent are a difference against the caller's snapshot at the expected revision; a hash
-- that does not hold as many records as that snapshot was damaged behind the revision's back (a key or a
-- field deleted), so the commit is refused and the next load sees the loss.
-- Refuse before writing anything: Redis does not roll back a script that fails half-way.
local expected = {{KEYS[1], 'string'}, {KEYS[2], 'string'}, {KEYS[3], 'zset'}, {KEYS[4], 'stream'}, {KEYS[6], 'list'}, {KEYS[7], 'hash'}}
for _, pair in ipairs(expected) do
  local kind = redis.call('TYPE', pair[1])['ok']
  if kind ~= 'none' and kind ~= pair[2] then
    return redis.error_reply('WRONGTYPE key ' .. pair[1] .. ' holds a ' .. kind .. ', expected a ' .. pair[2])
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return {0, now} end
if now < tonumber(ARGV[2]) then return {0, now} end
local records = tonumber(ARGV[5])
if records >= 0 and redis.call('HLEN', KEYS[7]) ~= records then return {0, now} end
local i = 6
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local score = redis.call('ZSCORE', KEYS[3], ARGV[i])
  if score and tonumber(score) ~= tonumber(ARGV[i + 1]) then return {0, now} end
  i = i + 2
end
-- An empty header: only leases move (no record, no event), and the header and revision stay, as with
-- renew.lua; every cache at this revision stays valid.
local rev = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[3])
  rev = math.max(rev + 1, now * 1000)
  redis.call('SET', KEYS[2], string.format('%d', rev))
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZADD', KEYS[3], 'GT', ARGV[i + 1], ARGV[i])
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZREM', KEYS[3], ARGV[i])
  i = i + 1
end
if records < 0 then
  redis.call('DEL', KEYS[7])
  redis.call('DEL', KEYS[5])
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[7], ARGV[i], ARGV[i + 1])
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HDEL', KEYS[7], ARGV[i])
  i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[i], 'revision', string.format('%d', rev), 'at', now)
  i = i + 1
end
local taken = tonumber(ARGV[i]); i = i + 1
if taken > 0 then redis.call('LTRIM', KEYS[6], taken, -1) end
local ttl = ARGV[i]; i = i + 1
n = tonumber(ARGV[i]); i = i + 1
for k = 1, n do
  redis.call('RPUSH', KEYS[7 + k], ARGV[i])
  redis.call('PEXPIRE', KEYS[7 + k], ttl)
  i = i + 1
end
-- A wake-up is a shortcut: a user whose ACL forbids PUBLISH still commits (pcall ignores the refusal).
if ARGV[i + 1] ~= '' then redis.pcall('PUBLISH', ARGV[i], ARGV[i + 1]) end
return {1, now, rev}
