-- Installs the fence of one ownership of a shard (see fence.rs). Every key it touches is declared.
-- KEYS[1]: the shard's owner record (the newest owner's fencing token); KEYS[2]: this ownership's fence;
-- KEYS[3]: the fence of the token the caller read in the owner record (any key when it read none).
-- ARGV[1]: the group; ARGV[2]: this ownership's token (a decimal integer); ARGV[3]: what the caller read in
-- the owner record ('' for nothing).
-- Returns 1: installed (or already in place); 0: a newer owner's fence is in place (nothing changed);
-- 2: installed over an owner record that was not a token (the previous fence, if any, is unknown);
-- 3: the owner record changed since the caller read it (nothing changed: read it again).
local function newer(a, b) -- decimal integers of any length, without leading zeros
  if #a ~= #b then return #a > #b end
  return a > b
end
local token = ARGV[2]
local current = redis.call('GET', KEYS[1])
if (current or '') ~= ARGV[3] then
  return 3
end
local status = 1
if current and not string.match(current, '^[1-9][0-9]*$') then
  current = false
  status = 2
end
if current and newer(current, token) then
  return 0
end
if current ~= token then
  if current then
    redis.call('DEL', KEYS[3])
  end
  redis.call('SET', KEYS[1], token)
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], '$', 'MKSTREAM')
end
return status
